"""Building requests' matchers on worker threads, so that nobody who serves other requests waits
for a compile: neither a server's event loop (its /health, its other requests) nor a unit's loop
(its other requests' steps).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from disaggsdk.engine.structured.grammar import GRAMMAR_TIME_LIMIT_S, build_matcher, check_value_bytes, ll_tokenizer
from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError

NUM_WORKERS = 2  # builds at once; a unit shares its cores with its engine, a server with its event loop
ADMISSION_WAIT_S = 0.1  # how long a server's check blocks its caller (an event loop) for a build


@dataclass
class GrammarBuild:
    """One matcher being built on a worker thread."""

    output: StructuredOutput
    future: Future = field(default_factory=Future)  # None when built; `StructuredOutputError` when not
    started_s: float | None = None  # `time.monotonic()` when a worker began it (queued until then)

    def running_s(self, now_s: float) -> float:
        """Seconds it has been building (0 while queued)."""
        return 0.0 if self.started_s is None else now_s - self.started_s


class GrammarCompiler:
    """Builds ``model``'s matchers on `NUM_WORKERS` threads.

    Args:
        model: the served model; its `ll_tokenizer` is built here (once a process: about a second).
        time_limit_s: how long one build may run before a unit refuses it (`too_slow`).
    Raises:
        StructuredOutputError: the model has no tokenizer for grammars.
    """

    def __init__(self, model: str, time_limit_s: float = GRAMMAR_TIME_LIMIT_S):
        self.tokenizer = ll_tokenizer(model)
        self.time_limit_s = time_limit_s
        self._workers = ThreadPoolExecutor(NUM_WORKERS, thread_name_prefix="disaggsdk-grammar")

    def start(self, output: StructuredOutput) -> GrammarBuild:
        """Queue a build of ``output``'s matcher."""
        build = GrammarBuild(output)
        build.future = self._workers.submit(self._build, build)
        return build

    def _build(self, build: GrammarBuild) -> None:
        build.started_s = time.monotonic()
        build_matcher(build.output, self.tokenizer)  # kept by build_matcher: the engine's build copies it

    def check(self, output: StructuredOutput, wait_s: float = ADMISSION_WAIT_S) -> None:
        """Refuse ``output`` when its text is over the size limit or its build fails within ``wait_s``;
        a build still running then goes on unwatched (a unit builds it again, with the same limits).

        Raises:
            StructuredOutputError: it is too large, or its build failed (`grammar.build_matcher`).
        """
        check_value_bytes(output)  # before any work: the probe's 689 KB list is refused in microseconds
        build = self.start(output)
        try:
            build.future.result(timeout=wait_s)
        except FutureTimeout:
            build.future.cancel()  # still queued: not built at all; running: it ends on its own

    def too_slow(self, output: StructuredOutput) -> StructuredOutputError:
        """The error of a build that ran past ``time_limit_s``."""
        return StructuredOutputError(
            f"structured output {output.kind}: the grammar did not compile within {self.time_limit_s:g} s; "
            "send a smaller or simpler schema, pattern or choice list")

    def close(self) -> None:
        """Stop taking builds; those running finish on their threads."""
        self._workers.shutdown(wait=False, cancel_futures=True)


@functools.lru_cache(maxsize=4)
def grammar_compiler(model: str) -> GrammarCompiler:
    """The process's compiler for ``model`` (its threads and tokenizer built once).

    Raises:
        StructuredOutputError: the model has no tokenizer for grammars.
    """
    return GrammarCompiler(model)
