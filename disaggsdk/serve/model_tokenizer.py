"""A model's tokenizer, loaded on first use: what a backend's ``encode`` and ``decode`` read."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from disaggsdk.launch.base import LaunchError

if TYPE_CHECKING:
    from disaggsdk.engine.tokenizer import Tokenizer


class ModelTokenizer:
    """The tokenizer of ``model`` (a catalog name or a checkpoint directory), loaded once, lazily
    (a deployment fed token ids never needs it)."""

    def __init__(self, model: str):
        self.model = model
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()  # the HTTP edge parses requests on several worker threads

    def get(self) -> Tokenizer:
        """The tokenizer.

        Raises:
            LaunchError: the model has none (send token ids instead of text).
        """
        with self._lock:
            if self._tokenizer is None:
                from disaggsdk.engine.tokenizer import load_tokenizer

                self._tokenizer = load_tokenizer(self.model)
                if self._tokenizer is None:
                    raise LaunchError(f"{self.model} has no tokenizer; send token ids")
            return self._tokenizer

    def get_or_none(self) -> Tokenizer | None:
        """The tokenizer, or None when the model has none."""
        try:
            return self.get()
        except LaunchError:
            return None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (with BOS)."""
        return self.get().encode(text, add_bos=True)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids`` (without special tokens unless asked)."""
        return self.get().decode(list(token_ids), skip_special_tokens=skip_special_tokens)
