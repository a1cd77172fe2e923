"""A model's tokenizer, loaded on first use: what a backend's ``encode`` and ``decode`` read."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from disaggsdk.launch.base import LaunchError
from disaggsdk.serve.http.error_bodies import BadRequestError

if TYPE_CHECKING:
    from disaggsdk.engine.tokenizer import Tokenizer


class PromptTooLong(BadRequestError):
    """A prompt text that cannot fit the model's context, refused before it was tokenized (a 400)."""


def encode_prompt(tokenizer: Tokenizer, text: str, max_model_len: int | None) -> list[int]:
    """Token ids of ``text`` as a prompt (BOS first where the model has one).

    A text that holds more tokens than ``max_model_len`` for certain (`Tokenizer.min_tokens`) is refused
    at once: tokenizing the 4M tokens of an 8 MiB body takes seconds of a core for a 400 in the end.

    Raises:
        PromptTooLong: the text cannot fit.
    """
    if max_model_len is not None:
        at_least = tokenizer.min_tokens(text) + (tokenizer.bos_token_id is not None)
        if at_least > max_model_len:
            raise PromptTooLong(f"this model's context is {max_model_len} tokens, and the prompt's "
                                f"{len(text):,} characters hold at least {at_least:,}; shorten the prompt",
                                param="prompt")
    return tokenizer.encode(text, add_bos=True)


class ModelTokenizer:
    """The tokenizer of ``model`` (a catalog name or a checkpoint directory), loaded once, lazily
    (a deployment fed token ids never needs it); prompts longer than ``max_model_len`` tokens are
    refused (`encode_prompt`)."""

    def __init__(self, model: str, max_model_len: int | None = None):
        self.model = model
        self.max_model_len = max_model_len
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
        """Token ids of ``text`` (with BOS).

        Raises:
            PromptTooLong: ``text`` holds more than ``max_model_len`` tokens for certain.
        """
        return encode_prompt(self.get(), text, self.max_model_len)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids`` (without special tokens unless asked)."""
        return self.get().decode(list(token_ids), skip_special_tokens=skip_special_tokens)
