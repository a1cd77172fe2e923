"""Training the tiny catalog checkpoints on a corpus every machine has offline.

Pieces, each tested on its own: `corpus` (the running interpreter's standard library sources, a
fixed file list, a SHA-256 manifest, a held-out slice), `tokenizer` (byte-level BPE trained with
the `tokenizers` library, the chat special tokens, a Qwen-style chat template), `train` (the
dense and MoE Qwen3 models, deterministic and resumable, bits per byte on the held-out slice).
Not yet here: the DeepSeek MTP head and its loss, the eval command, the loss-curve picture, and
the catalog's tiny names resolving to shipped trained checkpoints.
"""
