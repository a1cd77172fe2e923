"""How fast this machine runs engine work, sampled all along a measurement, to correct for drift.

A shared VM's speed drifts: within an hour the same 512-token prefill took 97 ms and 187 ms and
a batch-1 decode step of the tiny model 5 ms and 8 ms, and identical benchmark runs a minute apart
differ by 10-25% in mean TPOT. A profile fitted at one minute is then that far off a few minutes
later, whatever the model. Probing the speed just before and after a run does not fix it: the
speed also flickers, probes two seconds apart differ by up to 25%.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

import attrs

from disaggsdk.sim.hardware import HardwareProfile

MONITOR_MODEL = "qwen3-coder-tiny"
PREFILL_TOKENS = 128
DECODE_STEPS_PER_PREFILL = 2
SAMPLE_INTERVAL_S = 0.6
MIN_DECODE_SAMPLES = 3  # fewer in a window: no speed for it


@attrs.frozen
class MachineSpeed:
    """Median CPU time of the monitor's prefill and of its decode step in some window, ms.

    Two numbers, because a VM does not slow down evenly: matrix work suffers most from a busy
    neighbour on the host core, while a tiny model's decode step is mostly interpreter and
    dispatch overhead.
    """

    prefill_cpu_ms: float
    decode_step_cpu_ms: float


def has_speed(profile: HardwareProfile) -> bool:
    """Whether ``profile`` records the speed it was calibrated at (older profiles do not)."""
    return profile.monitor_prefill_cpu_ms > 0 and profile.monitor_decode_step_cpu_ms > 0


def speed_factors(profile: HardwareProfile, now: MachineSpeed | None) -> tuple[float, float]:
    """(decode-step factor, prefill factor): how much slower than at calibration (> 1: slower).

    Both are 1 for a profile that records no speed, or when ``now`` is unknown (None).
    """
    if now is None or not has_speed(profile):
        return 1.0, 1.0
    return (now.decode_step_cpu_ms / profile.monitor_decode_step_cpu_ms,
            now.prefill_cpu_ms / profile.monitor_prefill_cpu_ms)


def retimed(profile: HardwareProfile, now: MachineSpeed | None) -> HardwareProfile:
    """``profile`` re-timed from its calibration's speed to the speed ``now``.

    The matrix rate follows the prefill; every other rate, time and CPU cost follows the decode
    step (see `MachineSpeed`). A profile that records no speed, or an unknown ``now`` (None), is
    returned as it is.
    """
    decode_factor, prefill_factor = speed_factors(profile, now)
    return profile.slowed_by(decode_factor, matrix_factor=prefill_factor)


class SpeedMonitor:
    """The sampling process, started on entering and stopped on leaving the ``with`` block.

    Raises:
        RuntimeError: the sampling process did not report within ``start_timeout_s``.
    """

    def __init__(self, start_timeout_s: float = 120.0):
        self._samples: list[tuple[float, str, float]] = []  # (monotonic s, "P" or "D", cpu ms)
        self._lock = threading.Lock()
        self._first = threading.Event()
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> SpeedMonitor:
        self._process = subprocess.Popen([sys.executable, "-m", "disaggsdk.calibrate.speed_monitor"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, name="speed-monitor", daemon=True)
        self._reader.start()
        if not self._first.wait(self._start_timeout_s):
            self.__exit__(None, None, None)
            raise RuntimeError(f"the speed monitor did not report within {self._start_timeout_s} s")
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None, "started with a stdout pipe"
        for line in self._process.stdout:
            kind, at_s, cpu_ms = line.split()
            with self._lock:
                self._samples.append((float(at_s), kind, float(cpu_ms)))
            if kind == "D":
                self._first.set()

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._process.stdout is not None:  # always: started with a pipe
                self._process.stdout.close()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def speed(self, start_s: float, end_s: float) -> MachineSpeed | None:
        """The medians of the samples taken between two `time.monotonic` readings (None: too few)."""
        with self._lock:
            window = [(kind, ms) for at_s, kind, ms in self._samples if start_s <= at_s <= end_s]
        decode = [ms for kind, ms in window if kind == "D"]
        prefill = [ms for kind, ms in window if kind == "P"]
        if len(decode) < MIN_DECODE_SAMPLES or not prefill:
            return None
        return MachineSpeed(statistics.median(prefill), statistics.median(decode))

    def speed_since(self, start_s: float, max_wait_s: float = 10.0) -> MachineSpeed | None:
        """The speed from ``start_s`` until now, waiting up to ``max_wait_s`` for enough samples
        when the window is too short to hold them (None: still too few)."""
        deadline_s = time.monotonic() + max_wait_s
        speed = self.speed(start_s, time.monotonic())
        while speed is None and time.monotonic() < deadline_s:
            time.sleep(SAMPLE_INTERVAL_S / 2)
            speed = self.speed(start_s, time.monotonic())
        return speed


def _sample_forever() -> None:
    """The monitor process: time the fixed work and print one line a sample until told to stop."""
    import torch

    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    torch.set_num_threads(1)
    parent = os.getppid()
    engine = LLMEngine(MONITOR_MODEL, EngineConfig(page_size=16, num_pages=32, max_num_batched_tokens=PREFILL_TOKENS,
                                                   max_num_seqs=1, compile_in_background=False))
    params = SamplingParams(max_tokens=DECODE_STEPS_PER_PREFILL + 1, ignore_eos=True)
    engine.generate([[7] * PREFILL_TOKENS], params)  # first calls pay for allocations
    for request in range(sys.maxsize):
        engine.add_request(f"monitor-{request}", [7] * PREFILL_TOKENS, params)
        kind = "P"
        while engine.has_unfinished():
            start_cpu_s = time.thread_time()
            engine.step()
            cpu_ms = (time.thread_time() - start_cpu_s) * 1e3
            try:
                print(f"{kind} {time.monotonic():.4f} {cpu_ms:.4f}", flush=True)
            except BrokenPipeError:
                return
            if os.getppid() != parent:
                return  # whoever started us is gone
            kind = "D"
            time.sleep(SAMPLE_INTERVAL_S)


if __name__ == "__main__":
    _sample_forever()
