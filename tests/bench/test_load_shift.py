"""The load-shift driver's arithmetic: phases as written on the command line, seeded schedules, and
per-phase attainment over the last half (a live run: tests/serve/test_unit_control.py)."""

from __future__ import annotations

import pytest

from disaggsdk.bench.load_shift import LoadShiftError, Phase, Sent, main, schedule, summarize


def test_phases_parse_and_bad_ones_say_how_to_write_them(capsys):
    assert Phase.parse("long:30:2.5:1024:8") == Phase("long", 30.0, 2.5, 1024, 8)
    for bad in ("long:30:2", "long:x:2:1:1", "long:30:0:1024:8"):
        with pytest.raises(LoadShiftError, match="long"):
            Phase.parse(bad)
    assert main(["http://127.0.0.1:9", "--model", "m", "--phase", "nope", "--ttft-ms", "1", "--tpot-ms", "1"]) == 2
    assert "NAME:SECONDS:QPS:INPUT_LEN:OUTPUT_LEN" in capsys.readouterr().err


def test_a_schedule_is_seeded_and_keeps_each_phase_in_its_time():
    phases = [Phase("a", 10, 5, 4, 2), Phase("b", 10, 1, 8, 2)]
    plan = schedule(phases, seed=3)
    assert plan == schedule(phases, seed=3) and plan != schedule(phases, seed=4)
    assert all(0 <= t < 10 for t, i, _ in plan if i == 0) and all(10 <= t < 20 for t, i, _ in plan if i == 1)
    assert all(len(prompt) == phases[i].input_len for _, i, prompt in plan)
    assert 30 < sum(i == 0 for _, i, _ in plan) < 70  # about 5 a second for 10 s


def test_attainment_counts_the_last_half_and_failures_miss():
    phase = Phase("p", 10, 1, 4, 3)
    good = Sent(0, 6.0, 106.0, [106.1, 106.12, 106.14])  # TTFT 100 ms, TPOT 20 ms
    slow = Sent(0, 7.0, 107.0, [109.0, 109.02, 109.04])  # TTFT 2 s
    early = Sent(0, 1.0, 101.0, [103.0, 103.5, 104.0])  # first half: counted in "attainment" only
    failed = Sent(0, 8.0, 108.0, error="HTTP 500")
    [row] = summarize([phase], [good, slow, early, failed], ttft_ms=500, tpot_ms=50)
    assert row["requests"] == 4 and row["failed"] == 1
    assert row["attainment"] == 0.25 and row["attainment_last_half"] == pytest.approx(1 / 3)
    assert row["max_itl_ms"] == pytest.approx(500)
