"""The start-up lines a launcher shows, one per unit and step: what a quiet minute is spent on.

Worded here once for `launch.units` (a deployment's units, from their `messages.Progress` frames) and
``disaggsdk serve`` (one engine in process). Plain strings: the caller picks the output (stdout in a
terminal or notebook; stderr under ``--json``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.launch.messages import Progress

# Said while a step compiles, so that a quiet start is expected, not feared. Measured on CPU
# (qwen3-coder-tiny, 3 units on 2 shared cores, 2026-12-06): 127-188 s with an empty compile cache, 26 s from it
FIRST_COMPILE_WORDS = "minutes on a first start; later starts reuse torch's compile cache"

ProgressListener = Callable[[str], None]


def loading_line(name: str, model: str, weight_bytes: int = 0) -> str:
    """``decode-0: loading weights (qwen3-coder-tiny, 27.3 MB per rank)`` (no size when 0)."""
    size = f", {weight_bytes / 1e6:,.1f} MB per rank" if weight_bytes else ""
    return f"{name}: loading weights ({model}{size})"


def compiling_line(name: str) -> str:
    """``decode-0: compiling its step with torch.compile (minutes on a first start; ...)``."""
    return f"{name}: compiling its step with torch.compile ({FIRST_COMPILE_WORDS})"


def progress_line(msg: Progress) -> str:
    """One short line for a unit's start-up step."""
    if msg.stage == "loading":
        return loading_line(msg.name, msg.model, msg.weight_bytes)
    if msg.stage == "compiling":
        return compiling_line(msg.name)
    return f"{msg.name}: compiled in {msg.elapsed_s:.1f} s"
