"""The expert-parallel step bench at a tiny size: two spawned dp ranks of deepseek-r1-tiny (ep 2) and the
tp 1 baseline. What it reports per step must be the dispatcher's own accounting, consistent across the
two ranks and with the model's shape; timings are only checked for being there and nested."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from disaggsdk.bench.expert_parallel_step import cores_of, cpu_model_name, main, run_bench
from disaggsdk.models import resolve_model

MODEL = "deepseek-r1-tiny"
ARCH = resolve_model(MODEL)
MOE_LAYERS = ARCH.num_layers - ARCH.first_k_dense  # MTP off: the MTP layer does not run
ROW_BYTES = ARCH.hidden_size * 4  # float32 rows on the CPU engine
STEPS = 3
COUNTS = ("num_dispatches", "num_combines", "num_all_to_all_calls", "dispatch_payload_bytes", "combine_payload_bytes",
          "metadata_bytes", "local_bytes", "rows_sent", "rows_received")


@pytest.fixture(scope="module")
def result() -> dict:
    """One run of the command line: batch 1, one warm-up step, three measured (its stdout parsed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--model", MODEL, "--batch", "1", "--warmup-steps", "1", "--steps", str(STEPS)]) == 0
    return json.loads(out.getvalue())


def test_the_json_names_the_shape_and_the_machine(result):
    assert (result["model"], result["tp"], result["dp"], result["ep"], result["mtp_tokens"]) == (MODEL, 1, 2, 2, 0)
    assert result["cpu_model"] == cpu_model_name() and result["num_cpus"] >= 1
    assert len(result["load_avg_before"]) == 3
    [entry] = result["batches"]
    assert (entry["batch_per_rank"], entry["instance_batch"]) == (1, 2)
    assert [r["dp_rank"] for r in entry["ranks"]] == [0, 1]
    base = entry["baseline_tp1_no_ep"]
    assert (base["at_batch"]["batch"], base["at_instance_batch"]["batch"]) == (1, 2)
    assert base["at_batch"]["step_ms_median"] > 0 and "exchange_share" not in base["at_batch"]


def test_every_measured_step_is_a_decode_step_of_the_batch(result):
    for rank in result["batches"][0]["ranks"]:
        assert len(rank["steps"]) == STEPS
        for step in rank["steps"]:
            assert step["decode_only"] and step["num_requests"] == step["num_tokens"] == 1
            assert 0 < step["exchange_s"] <= step["step_s"]  # the exchange happens inside the step
        assert 0 < rank["exchange_share"] <= 1


def test_bytes_and_calls_per_step_are_the_dispatchers_accounting(result):
    entry = result["batches"][0]
    ranks = entry["ranks"]
    for rank in ranks:
        for step in rank["steps"]:
            # every MoE layer dispatches and combines once: 3 collectives + 1, exactly the simulator's count
            assert (step["num_dispatches"], step["num_combines"]) == (MOE_LAYERS, MOE_LAYERS)
            assert step["num_all_to_all_calls"] == 4 * MOE_LAYERS == entry["sim"]["num_all_to_all_calls_per_step"]
            # every (token, slot) pair leaves as a row, to the other rank (payload) or to itself (a local copy,
            # counted once in dispatch and once in combine)
            assert step["rows_sent"] == 1 * ARCH.num_experts_per_tok * MOE_LAYERS
            assert step["dispatch_payload_bytes"] + step["local_bytes"] // 2 == step["rows_sent"] * ROW_BYTES
            remote_rows = step["dispatch_payload_bytes"] // ROW_BYTES
            assert step["metadata_bytes"] == MOE_LAYERS * 1 * 8 + remote_rows * 8  # split counts + expert ids
            assert step["payload_bytes"] == step["dispatch_payload_bytes"] + step["combine_payload_bytes"]
        # the window's totals are the dispatcher's own, taken around all the steps
        for name in COUNTS:
            assert rank["window_totals"][name] == sum(s[name] for s in rank["steps"]), name
        for name in ("payload_bytes", "metadata_bytes", "num_all_to_all_calls"):
            assert rank[f"{name}_per_step"] == pytest.approx(rank["window_totals"][name] / STEPS)
        assert rank["exchange_ms_mean"] == pytest.approx(1e3 * rank["window_totals"]["exchange_s"] / STEPS, abs=1e-3)
    # what one rank dispatches to the other comes back from it in combine, step by step
    for s0, s1 in zip(ranks[0]["steps"], ranks[1]["steps"]):
        assert s0["dispatch_payload_bytes"] == s1["combine_payload_bytes"]
        assert s1["dispatch_payload_bytes"] == s0["combine_payload_bytes"]
        assert s0["rows_received"] + s1["rows_received"] == s0["rows_sent"] + s1["rows_sent"]


def test_cores_of_gives_each_rank_its_own_cores_and_wraps_when_short():
    assert [cores_of(d, 1, 2) for d in range(2)] == [[0], [1]]
    assert [cores_of(d, 2, 8) for d in range(2)] == [[0, 1], [2, 3]]
    assert [cores_of(d, 1, 2) for d in range(4)] == [[0], [1], [0], [1]]  # 4 ranks on 2 cores share them


def test_a_shape_without_expert_parallelism_is_refused():
    with pytest.raises(ValueError, match="at least 2 ranks"):
        run_bench(MODEL, dp=1, tp=1)
    with pytest.raises(ValueError, match="--steps"):
        run_bench(MODEL, batches=(1,), steps=0)


def test_a_failing_rank_is_named_and_no_process_is_left_behind():
    import multiprocessing

    # a dense model has no experts to spread: each rank's engine refuses ep 2 at start
    with pytest.raises(RuntimeError, match=r"rank \d: error: EngineError: ep=2"):
        run_bench("qwen3-tiny", batches=(1,), steps=1, warmup_steps=0, baseline=False)
    assert multiprocessing.active_children() == []
