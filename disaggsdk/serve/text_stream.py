"""Token ids -> streamed text, with stop strings matched on the text.

Text is released only when it is final: a trailing partial UTF-8 character (decoded as U+FFFD)
waits for its next bytes, and the last ``len(longest stop) - 1`` characters wait until they can
no longer begin a stop string. The stop string itself is never sent (OpenAI's behaviour).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"


class TextStream:
    """The text of one request's output, released in safe pieces.

    Args:
        decode: token ids -> text of the served model.
        stop: stop strings (may be empty).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = tuple(stop)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self.token_ids: list[int] = []
        self.sent_text = ""
        self.stopped = False  # a stop string was found; the request should end

    def add(self, token_ids: Sequence[int], final: bool = False) -> str:
        """Take new tokens; return the text now safe to send (possibly "").

        Args:
            token_ids: the request's next tokens.
            final: no more tokens will come: release everything held back.
        """
        if self.stopped:
            return ""
        self.token_ids.extend(token_ids)
        text = self._decode(self.token_ids)
        # a stop string may straddle what was sent and what is new: search from before the cut
        start = max(0, len(self.sent_text) - self._holdback)
        hits = [i for i in (text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            return self._release(text[: min(hits)])
        if not final:
            safe = len(text)
            while safe > 0 and text[safe - 1] == REPLACEMENT_CHAR:
                safe -= 1
            text = text[: max(len(self.sent_text), safe - self._holdback)]
        return self._release(text)

    def _release(self, text: str) -> str:
        # decoding more tokens never rewrites released text for byte-level and BPE decoders alike
        # except at a held-back replacement char, which is why those are never released early
        new = text[len(self.sent_text):] if text.startswith(self.sent_text) else ""
        self.sent_text += new
        return new
