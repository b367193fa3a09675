// tokenize: the text/ layer on the command line, without LibTorch (hpctrain/text/tokenize_tool.hpp).
//
//   tokenize encode  --tokenizer FILE [--special | --no-special] [TEXT_FILE...]
//       the ids of each input line (stdin when no file), space-separated, one output line per input line
//   tokenize decode  --tokenizer FILE [IDS_FILE...]
//       the reverse: each line of ids becomes the text it stands for
//   tokenize prepare --tokenizer FILE --out DIR [--documents fortunes|paragraphs|lines|file]
//                    [--validation FRACTION] [--seed N] [--threads N] [--end-of-text TOKEN]
//                    [--text-column NAME] TEXT_FILE...
//       writes DIR/train.tokens and DIR/val.tokens; prints token counts and MB/s (--text-column: the inputs are
//       datasets — JSONL, Parquet, a directory of shards, a save_to_disk folder — each row's NAME a document)
//   tokenize COMMAND --help
//
// FILE is a Hugging Face tokenizer.json, or a tiktoken ranks file (`*.tiktoken`; cl100k/o200k in the name
// choose their pattern and specials, else GPT-2's). Special tokens are recognised as the reference does by
// default: always for tokenizer.json (HF), never for ranks (tiktoken's encode_ordinary).
// Bad usage exits 2; an input or a tokenizer that cannot be read exits 1 naming the file.
#include <hpctrain/text/tokenize_tool.hpp>

int main(int argc, char** argv) { return hpctrain::text::tokenize_main(argc, argv); }
