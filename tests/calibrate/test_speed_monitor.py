"""The speed monitor: a real sampling process, and re-timing a profile to the speed it saw."""

import os
import time

import attrs
import pytest

from disaggsdk.calibrate.speed_monitor import (
    DECODE_STEPS_PER_PREFILL,
    MachineSpeed,
    SpeedMonitor,
    has_speed,
    retimed,
    speed_factors,
)
from disaggsdk.sim.hardware import load_profile

H100 = load_profile("h100")
CALIBRATED = attrs.evolve(H100, monitor_prefill_cpu_ms=30.0, monitor_decode_step_cpu_ms=8.0,
                          step_overhead_ms=2.0, frontend_cpu_ms_per_token=0.5, idle_unit_cores=0.02)


def test_slowed_by_divides_rates_and_multiplies_times():
    slow = CALIBRATED.slowed_by(2.0, matrix_factor=4.0)
    assert slow.hbm_gb_per_s == pytest.approx(H100.hbm_gb_per_s / 2)
    assert slow.nic_gbps == pytest.approx(H100.nic_gbps / 2)
    assert slow.bf16_tflops == pytest.approx(H100.bf16_tflops / 4) and slow.fp8_tflops == pytest.approx(H100.fp8_tflops / 4)
    assert slow.step_overhead_ms == pytest.approx(4.0)
    assert slow.frontend_cpu_ms_per_token == pytest.approx(1.0)
    assert slow.idle_unit_cores == pytest.approx(0.04)
    assert (slow.monitor_decode_step_cpu_ms, slow.monitor_prefill_cpu_ms) == pytest.approx((16.0, 120.0))
    assert CALIBRATED.slowed_by(1.5).bf16_tflops == pytest.approx(H100.bf16_tflops / 1.5)
    with pytest.raises(ValueError, match="positive"):
        CALIBRATED.slowed_by(0.0)


def test_retimed_follows_the_speed_the_monitor_saw():
    now = MachineSpeed(prefill_cpu_ms=45.0, decode_step_cpu_ms=6.0)
    assert speed_factors(CALIBRATED, now) == pytest.approx((0.75, 1.5))
    again = retimed(CALIBRATED, now)
    assert again.step_overhead_ms == pytest.approx(1.5)
    assert again.bf16_tflops == pytest.approx(H100.bf16_tflops / 1.5)
    assert speed_factors(again, now) == pytest.approx((1.0, 1.0))  # re-timed to now, now is its speed
    assert not has_speed(H100) and retimed(H100, now) == H100  # no calibration speed: left as it is
    assert retimed(CALIBRATED, None) == CALIBRATED and speed_factors(CALIBRATED, None) == (1.0, 1.0)  # unknown now


def test_the_monitor_samples_in_windows_and_leaves_no_process():
    with SpeedMonitor() as monitor:
        start_s = time.monotonic()
        time.sleep(3.5)
        speed = monitor.speed(start_s, time.monotonic())
        pid = monitor._process.pid
        kinds = "".join(kind for _, kind, _ in monitor._samples)
        assert monitor.speed(start_s, start_s + 0.1) is None  # too few samples
        late_s = time.monotonic()
        assert monitor.speed_since(late_s) is not None  # waits for the samples it needs
        assert time.monotonic() - late_s < 10
    assert speed is not None and speed.prefill_cpu_ms > 0 and speed.decode_step_cpu_ms > 0
    # each request of the monitor is one prefill step, then its decode steps, labelled so: a sample's kind
    # is what it timed (compared by the pattern, not by which took longer: a loaded VM made the two medians
    # 17.5 and 17.9 ms once, and tests assert behaviour, never timings)
    cycle = "P" + "D" * DECODE_STEPS_PER_PREFILL
    assert kinds.count("P") >= 2 and kinds.startswith(cycle)
    assert kinds == (cycle * len(kinds))[:len(kinds)], kinds
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
