"""Token ids -> streamed text, with stop strings matched on the text.

Text is released only when it is final: a trailing partial UTF-8 character (decoded as U+FFFD)
waits for its next bytes, and the last ``len(longest stop) - 1`` characters wait until they can
no longer begin a stop string. The stop string itself is not sent (OpenAI's behaviour) unless
the request asks for it (vLLM's ``include_stop_str_in_output``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"


class TextStream:
    """The text of one request's output, released in safe pieces.

    Decoding is incremental (vLLM's prefix/read offsets): each step decodes only the tokens since
    the last complete piece plus the piece before it, for context (BPE spaces), instead of the
    whole output again.

    Args:
        decode: token ids -> text of the served model.
        stop: stop strings (may be empty).
        include_stop: send the stop string that ended the text too.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (), include_stop: bool = False):
        self._decode = decode
        self._stop = tuple(stop)
        self._include_stop = include_stop
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self.token_ids: list[int] = []
        self.sent_text = ""
        self.stopped = False  # a stop string was found; the request should end
        self._text = ""  # complete text of token_ids[:_read_offset]
        self._prefix_offset = 0  # decoding starts here: the previous piece, for context
        self._read_offset = 0  # tokens before this are in _text

    def add(self, token_ids: Sequence[int], final: bool = False) -> str:
        """Take new tokens; return the text now safe to send (possibly "").

        Args:
            token_ids: the request's next tokens.
            final: no more tokens will come: release everything held back.
        """
        if self.stopped:
            return ""
        self.token_ids.extend(token_ids)
        self._advance(final)
        text = self._text
        # a stop string may straddle what was sent and what is new: search from before the cut
        start = max(0, len(self.sent_text) - self._holdback)
        hits = [(i, i + len(s)) for s, i in ((s, text.find(s, start)) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            begin, end = min(hits)
            return self._release(text[: end if self._include_stop else begin])
        if not final:
            text = text[: max(len(self.sent_text), len(text) - self._holdback)]
        return self._release(text)

    def _advance(self, final: bool) -> None:
        context = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        window = self._decode(self.token_ids[self._prefix_offset:])
        # a trailing partial UTF-8 character (U+FFFD) waits for its next bytes, unless nothing more comes
        if len(window) > len(context) and (final or not window.endswith(REPLACEMENT_CHAR)):
            self._text += window[len(context):]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)

    def _release(self, text: str) -> str:
        new = text[len(self.sent_text):] if text.startswith(self.sent_text) else ""
        self.sent_text += new
        return new
