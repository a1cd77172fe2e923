"""`disaggsdk testbed bench`: bad input is one line and exit 2; the whole bench across a two-node
testbed on one short prompt and one shaped rate (slow: two launches through Ray, ~25 s with a warm
compile cache)."""

from __future__ import annotations

import json

import pytest

from disaggsdk.cli import main as cli_main
from disaggsdk.testbed import down
from tests.testbed.conftest import netns_skip_reason, unique_name


@pytest.mark.parametrize(("args", "says"), [
    (["--input-lens", "1k"], "testbed bench: invalid literal"),
    (["--ratios", "0"], "positive ratios"),
    (["--num-prompts", "many"], "--num-prompts 'many': give a whole number"),
    (["--reference-rate", "10gbps"], "write a number and a bit unit"),
    (["specs/no_such.yaml"], "spec file not found"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, capsys):
    code = cli_main.main(["testbed", "bench", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err


@pytest.mark.slow
def test_the_bench_measures_both_modes_across_the_shaped_link(run_cli):
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("ray")
    name = unique_name()
    try:
        done = run_cli("testbed", "bench", "--input-lens", "512", "--ratios", "2", "--num-prompts", "2",
                       "--name", name, timeout_s=900)
    finally:
        down(name)  # the bench takes its testbed down; a timed-out one would leave it
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = {(r["mode"], r["reference"]): r for r in result["rows"]}
    assert set(rows) == {("streaming", True), ("streaming", False), ("after_forward", True), ("after_forward", False)}
    shaped = rows["streaming", False]
    assert shaped["rate_mbit"] < result["config"]["reference_mbit"]
    assert shaped["transfer_to_compute"] == pytest.approx(2.0, rel=0.5)  # C varies between groups
    assert shaped["kv_bytes_per_layer"] == 512 * 2048  # qwen3-coder-tiny float32: 2 KiB a token a layer
    # the ablation waits for the whole transfer after the forward; streaming hid part of it
    assert rows["after_forward", False]["exposed_ms"] > shaped["exposed_ms"]
    assert rows["after_forward", False]["exposed_ms"] >= 0.9 * rows["after_forward", False]["line_transfer_ms"]
    assert result["cpu"]["model_name"] and result["summary"]["max_abs_sim_ttft_error"] is not None
