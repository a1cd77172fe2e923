"""llguidance's tokenizer for a byte-level BPE `tokenizer.json`, in which special tokens are only ever
special: text a grammar forces is tokenized as text.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llguidance import LLTokenizer


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a BPE token uses -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def is_byte_level(tokenizer_json: dict[str, Any]) -> bool:
    """Whether a parsed ``tokenizer.json`` is byte-level BPE (Qwen3's, DeepSeek-V3's, GPT-2's)."""
    decoder = tokenizer_json.get("decoder") or {}
    return tokenizer_json.get("model", {}).get("type") == "BPE" and decoder.get("type") == "ByteLevel"


class _TextOnlySpecials:
    """What `llguidance.TokenizerWrapper` reads: the vocabulary as bytes, the special ids, and a
    tokenizer that spells special tokens' text with ordinary tokens."""

    def __init__(self, path: Path, n_vocab: int, eos_token_id: int):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.encode_special_tokens = True  # "<tool_call>" in text is text
        added = json.loads(path.read_text()).get("added_tokens", [])
        self.special_token_ids = sorted(a["id"] for a in added if a.get("special"))
        special = set(self.special_token_ids)
        decoder = _byte_decoder()
        self.tokens: list[bytes] = []
        for i in range(n_vocab):
            piece = self._tokenizer.id_to_token(i)
            if piece is None:
                self.tokens.append(b"")  # an id past the tokenizer's vocabulary (padded embedding rows)
            elif i in special:
                self.tokens.append(piece.encode())
            else:
                self.tokens.append(bytes(decoder[c] for c in piece))
        self.eos_token_id = eos_token_id
        self.bos_token_id = None

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids


def byte_level_ll_tokenizer(path: Path, n_vocab: int, eos: list[int]) -> LLTokenizer:
    """An `llguidance.LLTokenizer` over the byte-level BPE ``tokenizer.json`` at ``path``.

    Args:
        path: the tokenizer file (`is_byte_level`).
        n_vocab: the model's vocabulary size (its embedding rows; may exceed the tokenizer's).
        eos: the token ids the engine stops on (at least one).
    """
    from llguidance import LLTokenizer, TokenizerWrapper

    return LLTokenizer(TokenizerWrapper(_TextOnlySpecials(path, n_vocab, eos[0])), n_vocab=n_vocab, eos_token=eos)
