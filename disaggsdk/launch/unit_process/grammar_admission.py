"""A unit's structured requests wait here while their grammars compile, off the unit's loop."""

from __future__ import annotations

import time

from disaggsdk.engine.structured.grammar import GRAMMAR_TIME_LIMIT_S
from disaggsdk.engine.structured.grammar_compiler import GrammarBuild, GrammarCompiler
from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError
from disaggsdk.launch import messages as ch


class GrammarAdmission:
    """Structured requests whose grammars are compiling, in arrival order.

    Args:
        model: the unit's model (its grammars' tokenizer).
        time_limit_s: how long one build may run before its request is refused.
    Raises:
        StructuredOutputError: the model has no tokenizer for grammars (only raised when the first
            structured request arrives: a unit serving a model without one starts all the same).
    """

    def __init__(self, model: str, time_limit_s: float = GRAMMAR_TIME_LIMIT_S):
        self.model, self.time_limit_s = model, time_limit_s
        self._compiler: GrammarCompiler | None = None
        self._pending: dict[str, tuple[ch.Generate, StructuredOutput, GrammarBuild]] = {}

    def hold(self, msg: ch.Generate) -> bool:
        """Start compiling ``msg``'s grammar and keep it until `ready` hands it back. Returns False
        (nothing held) when it asks for no grammar: it may be admitted at once.

        Raises:
            StructuredOutputError: the model has no tokenizer for grammars.
        """
        structured = msg.params.structured
        if structured is None:
            return False
        if self._compiler is None:
            self._compiler = GrammarCompiler(self.model, self.time_limit_s)
        self._pending[msg.request_id] = (msg, structured, self._compiler.start(structured))
        return True

    def ready(self, now_s: float | None = None) -> list[tuple[ch.Generate, str | None]]:
        """The held requests whose build ended or ran past the compiler's time limit (its time in
        the queue does not count), each with None (admit it) or the error to answer it with."""
        now_s = time.monotonic() if now_s is None else now_s
        out: list[tuple[ch.Generate, str | None]] = []
        compiler = self._compiler
        if compiler is None:  # nothing was ever held
            return out
        for rid, (msg, structured, build) in list(self._pending.items()):
            if build.future.done():
                error = build.future.exception()
                if error is not None and not isinstance(error, StructuredOutputError):
                    error = StructuredOutputError(f"structured output: the grammar cannot be built: {error}")
                out.append((msg, str(error) if error is not None else None))
            elif build.running_s(now_s) >= compiler.time_limit_s:
                out.append((msg, str(compiler.too_slow(structured))))
            else:
                continue
            del self._pending[rid]
        return out

    @property
    def num_held(self) -> int:
        """Requests whose grammar is still building (not in the engine yet)."""
        return len(self._pending)

    def abort(self, request_id: str) -> bool:
        """Drop a held request (its compile runs on, unread). Returns whether it was held."""
        return self._pending.pop(request_id, None) is not None

    def close(self) -> None:
        """Drop every held request and stop the compiler's workers taking more."""
        self._pending.clear()
        if self._compiler is not None:
            self._compiler.close()
