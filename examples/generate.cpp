// Text generation from a Hugging Face-format directory (config.json + model.safetensors or shards, and
// tokenizer.json or a *.tiktoken file for text), GPT-2, Llama, Qwen2 or Mistral, on the CPU in fp32
// (hpctrain/models/generation/generate_tool.hpp):
//   ./generate --model DIR --prompt "Once upon a time" [--max-new-tokens 32]            greedy, prints text
//   ./generate --model DIR --prompt TEXT --temperature 0.8 --top-k 40 --seed 1          sampled
//   ./generate --model DIR --prompt-ids "464 2068 7586"                                  ids in, ids out
//   ./generate --model DIR --prompt TEXT --ids                                           text in, ids out
//   ./generate --help
// The prompt is encoded as transformers' tokenizer encodes it (AutoTokenizer(dir)(text): the model directory's
// post-processor and tokenizer_config.json add Llama 3's BOS, RoBERTa's <s>, ...); with --tokenizer FILE, plainly.
// Greedy decoding equals transformers' generate(do_sample=False) token for token (tests/models).
// A config or checkpoint that does not fit (corrupt safetensors, a missing tensor) exits 1 with the file,
// the tensor and the reason before any weight is used; bad usage exits 2.
#include <hpctrain/models/generation/generate_tool.hpp>

int main(int argc, char** argv) { return hpctrain::models::generate_main(argc, argv); }
