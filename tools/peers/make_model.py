"""Build a tiny random Qwen3 checkpoint with its own 512-entry WordLevel tokenizer, saved so that both
vLLM and disaggsdk load the same directory offline.

Usage: python tools/peers/make_model.py OUT_DIR [--layers N --hidden H --max-position TOKENS]
"""

import argparse
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB_SIZE = 512


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--max-position", type=int, default=2048, help="the context: prompt + output tokens")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB_SIZE, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=args.hidden // 8, max_position_embeddings=args.max_position, bos_token_id=2, eos_token_id=1,
                      pad_token_id=0, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # std 0.02 gives near-flat logits (greedy near-ties); x3 keeps decisions apart
        for _, weight in model.named_parameters():
            if weight.dim() >= 2:
                weight.mul_(3.0)
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(bos_token_id=2, eos_token_id=1, pad_token_id=0, do_sample=False).save_pretrained(args.out)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"w{i}": i for i in range(3, VOCAB_SIZE)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<pad>")
    fast.model_max_length = args.max_position
    fast.save_pretrained(args.out)
    print("saved", args.out, sum(w.numel() for w in model.parameters()), "parameters")


if __name__ == "__main__":
    main()
