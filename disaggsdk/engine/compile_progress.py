"""What an engine says of compiling its step, in records and words a launcher can use without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CompileStage = Literal["compiling", "compiled", "failed"]


@dataclass(frozen=True)
class CompileProgress:
    """What an engine says of compiling its step (`LLMEngine`'s ``on_compile``; see
    `engine.background_compile`).

    Attributes:
        stage: "compiling" (it started; the engine serves eagerly meanwhile), "compiled" (steps run
            compiled from now on) or "failed" (the engine stays eager; ``error`` says why).
        elapsed_s: seconds from "compiling" to this outcome (0 for "compiling").
        error: "failed": the exception's type and message, one line.
    """

    stage: CompileStage
    elapsed_s: float = 0.0
    error: str = ""


def compile_failed_words(error: str) -> str:
    """The one line said when a step did not compile (``error``: `CompileProgress.error`): the
    engine goes on eagerly, and the setting that skips compiling."""
    return (f"its step did not compile ({error}): it serves on the eager step; "
            "`$.engine.compile: false` in the spec (or DISAGGSDK_COMPILE=0) skips compiling")
