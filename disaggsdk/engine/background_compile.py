"""Compiling a rank's step while the engine serves eagerly: a first token within seconds of start,
the compiled step's speed once it is ready.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
from disaggsdk.engine.compile_progress import CompileProgress
from disaggsdk.engine.graph_ops import warm_up_redirect
from disaggsdk.engine.modeling.layers.skinny import MAX_ROWS

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import AttentionBackend
    from disaggsdk.engine.compiled_step.torch_compile import CompiledStep

# torch 2.10 crashed the process (a segfault in FakeTensorMode) when the serving thread recompiled a
# graph after another thread had compiled it; 2.13, 2.14 and 2.15 ran it (make test-oldest, make
# test-latest, make test). Older torch compiles before the engine serves.
MIN_TORCH_FOR_BACKGROUND = (2, 13)


def background_supported() -> bool:
    """Whether this torch may compile on another thread than the one that runs the step."""
    release = torch.__version__.split("+")[0].split(".")
    return (int(release[0]), int(release[1])) >= MIN_TORCH_FOR_BACKGROUND


class CompileStopped(Exception):
    """The compile was asked to stop (`StepCompilation.stop`) and did, between two graphs."""


def warm_up_graphs(step: CompiledStep, scratch: AttentionBackend, page_size: int, device: torch.device,
                   on_layer_done: Callable[[int, torch.Tensor], None] | None, with_mtp: bool,
                   stop: threading.Event | None = None) -> None:
    """Run ``step`` with one token, two, and more than `skinny.MAX_ROWS` (its three graphs: the skinny
    matmuls branch on the rows), and the MTP draft after each when ``with_mtp``, so that each
    compiles now. The batches use page 0 of ``scratch`` (a backend over a KV cache of the engine's
    format that nothing else uses), planned here; ``on_layer_done`` is the engine's layer callback
    (the graphs are specialised on having one), which the warm-up never calls. ``stop`` set: it
    raises `CompileStopped` before the next graph.

    Raises:
        CompileStopped: ``stop`` was set.
    """
    with torch.inference_mode(), warm_up_redirect({step.attn.backend_id: scratch}):
        for num_tokens in (1, 2, MAX_ROWS + 1):
            if stop is not None and stop.is_set():
                raise CompileStopped
            item = BatchItem(token_ids=[0] * num_tokens, start_pos=0, page_ids=[0] * -(-num_tokens // page_size))
            batch = build_forward_batch([item], page_size, device, on_layer_done)
            scratch.plan(batch)
            hidden_all = step.forward(batch)  # planned on the scratch backend, not the engine's
            if with_mtp:
                last_row = torch.tensor([num_tokens - 1], dtype=torch.int64, device=device)
                step.mtp_draft(hidden_all, batch.input_ids, batch.positions, last_row, on_layer_done)


class StepCompilation:
    """One compile of a rank's step by `warm_up_graphs`, on a thread of its own or on the caller's.

    Args:
        step: the step to compile (made, not yet run).
        warm_up: runs it until every graph compiled (a `warm_up_graphs` call), given the event that
            asks it to stop.
        in_background: compile on a daemon thread (the engine serves eagerly meanwhile); False:
            compile now, in `start`.
    """

    def __init__(self, step: CompiledStep, warm_up: Callable[[threading.Event], None], in_background: bool):
        self.step = step
        self._warm_up = warm_up
        self._in_background = in_background
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._start_s = 0.0
        self._outcome: CompileProgress | None = None
        self._taken = False

    def start(self) -> None:
        """Begin compiling (and, not in the background, finish)."""
        self._start_s = time.monotonic()
        if self._in_background:
            # a daemon: threading's exit does not wait for it; `_stop_at_exit` does, after asking it to stop
            _running.add(self)
            threading.Thread(target=self._run, name="disaggsdk-compile", daemon=True).start()
        else:
            self._run()

    def stop(self) -> None:
        """Ask the compile to stop before its next graph (an engine closing): it ends unused."""
        self._stop.set()

    @property
    def running(self) -> bool:
        """Whether it started and has not ended."""
        return self._start_s > 0 and not self._ended.is_set()

    def _run(self) -> None:
        try:
            self._warm_up(self._stop)
            self._outcome = CompileProgress("compiled", time.monotonic() - self._start_s)
        except CompileStopped:
            self._outcome = CompileProgress("failed", time.monotonic() - self._start_s, "stopped: the engine closed")
        except Exception as exc:  # noqa: BLE001 - any failure of the compiler leaves the engine eager, and says so
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            self._outcome = CompileProgress("failed", time.monotonic() - self._start_s,
                                            f"{type(exc).__name__}: {first_line}")
        finally:
            self._ended.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the compile ended (or ``timeout_s`` passed); returns whether it ended."""
        return self._ended.wait(timeout_s)

    def outcome(self) -> CompileProgress | None:
        """The compile's outcome the first time it is asked after the compile ended, else None: the
        engine's thread asks at each step boundary and acts on it once."""
        if self._taken or not self._ended.is_set():
            return None
        self._taken = True
        return self._outcome


# the compiles running on threads of their own, for the process's exit (see the module docstring)
_running: weakref.WeakSet[StepCompilation] = weakref.WeakSet()


def running_compilations() -> list[StepCompilation]:
    """The background compiles of this process still running (a command line that ends while one
    runs leaves with ``os._exit`` rather than wait for it)."""
    return [c for c in _running if c.running]


@atexit.register
def _stop_at_exit() -> None:
    for compilation in running_compilations():
        compilation.stop()
    for compilation in running_compilations():
        compilation.wait()
