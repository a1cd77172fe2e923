"""The start-up lines a launcher shows, one per unit and step: what a quiet minute is spent on.

Worded here once for `launch.launcher.units` (a deployment's units, from their `messages.Progress` frames) and
``disaggsdk serve`` (one engine in process). Plain strings: the caller picks the output (stdout in a
terminal or notebook; stderr under ``--json``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.engine.compile_progress import CompileProgress
    from disaggsdk.launch.messages import Progress

# Said when a step starts compiling: the unit serves meanwhile, slower. Measured on CPU
# (qwen3-coder-tiny, 3 units on 2 shared cores, 2026-12-06): 127-188 s with an empty compile cache, 26 s from it
FIRST_COMPILE_WORDS = ("in the background, serving on the eager step meanwhile; minutes on a first start, "
                       "later starts reuse torch's compile cache")

ProgressListener = Callable[[str], None]


def loading_line(name: str, model: str, weight_bytes: int = 0) -> str:
    """``decode-0: loading weights (qwen3-coder-tiny, 27.3 MB per rank)`` (no size when 0)."""
    size = f", {weight_bytes / 1e6:,.1f} MB per rank" if weight_bytes else ""
    return f"{name}: loading weights ({model}{size})"


def compiling_line(name: str) -> str:
    """``decode-0: compiling its step with torch.compile (in the background, ...)``."""
    return f"{name}: compiling its step with torch.compile ({FIRST_COMPILE_WORDS})"


def compiled_line(name: str, elapsed_s: float) -> str:
    """``decode-0: compiled in 41.2 s: runs the compiled step from now on``."""
    return f"{name}: compiled in {elapsed_s:.1f} s: runs the compiled step from now on"


def compile_failed_line(name: str, error: str) -> str:
    """``decode-0: its step did not compile (...): it serves on the eager step; ...`` (one line)."""
    from disaggsdk.engine.compile_progress import compile_failed_words

    return f"{name}: {compile_failed_words(error)}"


def compile_progress_line(name: str, progress: CompileProgress) -> str:
    """The line for what an in-process engine says of compiling (``disaggsdk serve``)."""
    if progress.stage == "compiling":
        return compiling_line(name)
    if progress.stage == "failed":
        return compile_failed_line(name, progress.error)
    return compiled_line(name, progress.elapsed_s)


def progress_line(msg: Progress) -> str:
    """One short line for a unit's start-up step."""
    if msg.stage == "loading":
        return loading_line(msg.name, msg.model, msg.weight_bytes)
    if msg.stage == "compiling":
        return compiling_line(msg.name)
    if msg.stage == "compile_failed":
        return compile_failed_line(msg.name, msg.detail)
    return compiled_line(msg.name, msg.elapsed_s)
