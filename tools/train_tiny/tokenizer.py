"""The tiny models' tokenizer: byte-level BPE trained on the corpus with the `tokenizers` library.

A vocabulary of `VOCAB_SIZE` (a multiple of 8, so tensor-parallel tests split it evenly) with the
special tokens a chat model needs: end of text, ChatML's `<|im_start|>`/`<|im_end|>`, and the
markers of Qwen3-Coder's tool calls. Saved as a checkpoint ships one: `tokenizer.json`,
`tokenizer_config.json` (with the Jinja chat template in `chat_template.jinja`) and
`generation_config.json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 4096
END_OF_TEXT = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END, *TOOL_MARKERS)  # ids 0.. in this order
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
MAX_LENGTH_TOKENS = 4096  # the catalog's max_position_embeddings


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Byte-level BPE over ``texts`` (deterministic for the same texts in the same order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """The id of every special token."""
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def save_tokenizer_files(tok: Tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json (chat template included) and generation_config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    ids = special_ids(tok)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "unk_token": None,
        "model_max_length": MAX_LENGTH_TOKENS,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": [IM_START, IM_END, *TOOL_MARKERS],
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                     "single_word": False}
            for t, i in ids.items()
        },
        "chat_template": CHAT_TEMPLATE_PATH.read_text(),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    generation = {"eos_token_id": [ids[IM_END], ids[END_OF_TEXT]], "pad_token_id": ids[END_OF_TEXT],
                  "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n")
