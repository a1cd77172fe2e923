"""Training the tiny catalog checkpoints on a corpus every machine has offline (issue #16).

Pieces, each tested on its own: `corpus` (the running interpreter's standard library sources, a
fixed file list, a SHA-256 manifest, a held-out slice), `tokenizer` (byte-level BPE trained with
the `tokenizers` library, the chat special tokens, a Qwen-style chat template). Not yet here: the
training loop, the DeepSeek MTP head, the eval command and the trained checkpoints themselves.
"""
