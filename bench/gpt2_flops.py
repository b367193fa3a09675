"""Training FLOPs per token of GPT-2 (nanoGPT's count, what models::flops_per_token computes in C++): 6 x the
parameters without the position embeddings, plus attention's 12 x layers x width x sequence. Standard library
only, so that scripts/gpu-check (no torch) and bench/model_peer.py share it."""


def flops_per_token(vocab_size, n_layer, n_embd, seq):
    d, f = n_embd, 4 * n_embd
    per_block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * f + f) + (f * d + d)
    n = vocab_size * d + n_layer * per_block + 2 * d
    return 6 * n + 12 * n_layer * d * seq
