"""Text <-> token ids: a checkpoint's own ``tokenizer.json`` through the `tokenizers` library (the
tiny catalog models use their shipped checkpoint's), or a byte-level tokenizer for byte-level
checkpoints without one.

Byte-level ids: bytes 0..255 are ids 0..255, then bos 256, eos 257, pad 258; ids 259.. of a
512-entry vocabulary are never produced by `encode` and decode to nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from disaggsdk.errors import ModelError

BYTE_BOS, BYTE_EOS, BYTE_PAD = 256, 257, 258


class Tokenizer(Protocol):
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text`` (with the bos token first when ``add_bos`` and one exists)."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        ...

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))``, found without tokenizing: what lets a server refuse a
        prompt that cannot fit the context before it spends seconds tokenizing megabytes of it."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as token ids (for byte-level checkpoints without a tokenizer.json)."""

    bos_token_id: int | None = BYTE_BOS
    eos_token_ids: tuple[int, ...] = (BYTE_EOS,)
    pad_token_id = BYTE_PAD
    SPECIAL_TEXT = {BYTE_BOS: "<bos>", BYTE_EOS: "<eos>", BYTE_PAD: "<pad>"}

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BYTE_BOS, *ids] if add_bos else ids

    def min_tokens(self, text: str) -> int:
        return len(text.encode("utf-8"))  # exact: one id per byte

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out: list[str] = []
        run = bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special_tokens:
                out.append(self.SPECIAL_TEXT.get(i, f"<{i}>"))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


class HFTokenizer:
    """A checkpoint's ``tokenizer.json``; special ids come from config.json /
    generation_config.json (generation_config wins, as in transformers' generate)."""

    def __init__(self, directory: Path, config: dict[str, Any]):
        from tokenizers import Tokenizer as _Tokenizer

        path = directory / "tokenizer.json"
        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises a bare Exception on bad files
            raise ModelError(f"{path} cannot be read by the tokenizers library: {exc}") from None
        merged = dict(config)
        gen_path = directory / "generation_config.json"
        if gen_path.is_file():
            gen = json.loads(gen_path.read_text())
            merged.update({k: gen[k] for k in ("bos_token_id", "eos_token_id") if gen.get(k) is not None})
        bos = _as_ids(merged.get("bos_token_id"))
        self.bos_token_id = bos[0] if bos else None
        self.eos_token_ids = _as_ids(merged.get("eos_token_id"))
        self._longest_token_bytes: int | None = None  # `min_tokens`' divisor, found on first use

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        # encode_batch, not encode: the library lets go of the GIL only in its batch call, and a server
        # tokenizes on a worker thread while its event loop and the thread that reads the units'
        # heartbeats must keep running (a megabyte prompt takes seconds)
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def min_tokens(self, text: str) -> int:
        if self._longest_token_bytes is None:
            self._longest_token_bytes = self._bytes_a_token_covers_at_most()
        return -(-len(text.encode("utf-8")) // self._longest_token_bytes) if self._longest_token_bytes else 0

    def _bytes_a_token_covers_at_most(self) -> int:
        """The most bytes of a text one token stands for, 0 when no bound holds.

        A BPE token covers at most the bytes its vocabulary entry spells (a byte-level entry spells each byte
        as one character of one or two UTF-8 bytes, which overcounts: still a bound), an unknown character at
        most 4. No bound holds where a normalizer may shorten the text first (NFKC, ...), nor where one token
        may stand for any run of text: an unknown word in WordPiece, fused unknowns in BPE."""
        model = json.loads(self._tok.to_str()).get("model", {})
        if self._tok.normalizer is not None or model.get("type") != "BPE" or model.get("fuse_unk"):
            return 0
        vocab = self._tok.get_vocab(with_added_tokens=True)
        return max(4, *(len(t.encode("utf-8")) for t in vocab))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _is_byte_level(config: dict[str, Any]) -> bool:
    return (
        config.get("bos_token_id") == BYTE_BOS
        and _as_ids(config.get("eos_token_id")) == (BYTE_EOS,)
        and int(config.get("vocab_size", 0)) > BYTE_PAD
    )


def load_tokenizer(model: str) -> Tokenizer | None:
    """The tokenizer of a catalog name or checkpoint directory, or None when it has none.

    A tiny catalog model uses its shipped checkpoint's tokenizer (`ByteTokenizer` if the checkpoint
    is not installed). A directory uses its ``tokenizer.json``; without one, a config with the
    byte-level special ids (bos 256, eos 257) gets `ByteTokenizer`. Full-size catalog names have
    no tokenizer on this machine (None): pass token ids instead.

    Raises:
        ModelError: unknown model, or an unreadable config.json / tokenizer.json.
    """
    from disaggsdk.models import is_tiny, read_hf_config
    from disaggsdk.models.catalog import CATALOG
    from disaggsdk.models.shipped import shipped_checkpoint

    if model in CATALOG:
        if not is_tiny(model):
            return None
        directory = shipped_checkpoint(model)
        return HFTokenizer(directory, read_hf_config(directory)) if directory else ByteTokenizer()
    directory = Path(model).expanduser()
    config = read_hf_config(directory)
    if (directory / "tokenizer.json").is_file():
        return HFTokenizer(directory, config)
    if _is_byte_level(config):
        return ByteTokenizer()
    return None
