"""The link bench's pure parts (`disaggsdk.calibrate.link_bench`, `link_bench_node`): the spec it
runs, the pipe it asks the host for rates on, the simulator anchored on the reference group, the
rows and the summary. The run across a testbed is in tests/testbed/test_link_bench_cli.py."""

from __future__ import annotations

import io
import json

import attrs
import pytest

from disaggsdk.bench.link_figures import TCP_PAYLOAD_SHARE, wire_transfer_s
from disaggsdk.calibrate.link_bench import summarize, testbed_spec
from disaggsdk.calibrate.link_bench_node import (
    GroupMeasure,
    PipeLinkControl,
    bench_spec,
    fitted_overhead_ms,
    row,
    simulated_group_ttft_s,
)
from disaggsdk.errors import DisaggError
from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.spec import load_spec

# rates of the order `disaggsdk calibrate` fits for the tiny models on one 2-core VM's core
CPU_LIKE = HardwareProfile(name="cpu-like", hbm_gb_per_s=8.6, bf16_tflops=0.073, fp8_tflops=0.073, nvlink_gb_per_s=5.0,
                           nics_per_node=1, nic_gbps=40.0, flops_efficiency=1.0, bandwidth_efficiency=1.0,
                           step_overhead_ms=0.9, kernel_overhead_us_per_layer=0.0, transfer_write_overhead_us=10.0)


@pytest.fixture
def spec():
    return testbed_spec(load_spec("specs/tiny_pd.yaml"))


def test_the_testbed_spec_is_tcp_with_one_rank_a_node(spec):
    assert spec.transport.provider == "tcp" and spec.hardware.gpus_per_node == 1
    wide = load_spec("specs/tiny_pd.yaml")
    with pytest.raises(DisaggError, match="one prefill and one decode instance"):
        testbed_spec(attrs.evolve(wide, decode=attrs.evolve(wide.decode, replicas=2)))


def test_the_bench_spec_holds_the_longest_prompt_in_one_chunk_without_a_prefix_cache(spec):
    mode = bench_spec(spec, False, [1024, 16384])
    assert mode.transfer.streaming is False and mode.engine.prefix_caching is False
    assert mode.engine.max_num_batched_tokens >= 16384
    assert mode.engine.num_pages * mode.kv.page_size >= 2 * 16384
    assert mode.transfer.deadline_s >= 300


def test_the_pipe_asks_for_a_rate_and_waits_for_the_host():
    asked = io.StringIO()
    PipeLinkControl(asked, io.StringIO("ok\n")).set_rate(250.0)
    assert json.loads(asked.getvalue()) == {"set_link_mbit": 250.0}
    with pytest.raises(RuntimeError, match="error: tc failed"):
        PipeLinkControl(io.StringIO(), io.StringIO("error: tc failed\n")).set_rate(1.0)
    with pytest.raises(RuntimeError, match="pipe closed"):
        PipeLinkControl(io.StringIO(), io.StringIO("")).set_rate(1.0)


def test_the_simulator_given_a_groups_compute_prices_its_link(spec):
    engine = CPU_LIKE  # re-timed to what was measured
    reference = GroupMeasure(requests=3, bytes_per_request=8 << 20, compute_s=0.120, exposed_s=0.002,
                             exposed_after_last_layer_s=0.004, ttft_s=0.140)
    overhead_ms = fitted_overhead_ms(spec, engine, 1024, True, 10_000, reference)
    assert overhead_ms > 0
    # the reference group comes out as measured
    assert simulated_group_ttft_s(spec, engine, overhead_ms, 1024, 10_000, True, 0.120) == pytest.approx(0.140, rel=0.02)
    # a group whose compute ran 20 ms longer is simulated with it
    slower = simulated_group_ttft_s(spec, engine, overhead_ms, 1024, 10_000, True, 0.140)
    assert slower == pytest.approx(0.160, rel=0.03)
    # at a rate where the transfer takes 3x the compute, streaming leaves about T - C after the
    # forward, the ablation all of T
    slow_mbit = wire_transfer_s(8 << 20, 1.0) * 1.0 / (3 * 0.120)  # T = 3 C at this rate
    streaming = simulated_group_ttft_s(spec, engine, overhead_ms, 1024, slow_mbit, True, 0.120)
    ablation = simulated_group_ttft_s(spec, engine, overhead_ms, 1024, slow_mbit, False, 0.120)
    assert 0.140 + 0.2 < streaming < ablation
    assert ablation == pytest.approx(0.140 + 0.36, rel=0.1)


def test_rows_put_the_floor_and_goodput_where_they_belong(spec):
    measured = GroupMeasure(requests=3, bytes_per_request=8 << 20, compute_s=0.1, exposed_s=0.3,
                            exposed_after_last_layer_s=0.33, ttft_s=0.45)
    rate_mbit = wire_transfer_s(8 << 20, 1.0) / 0.3  # T = 300 ms, headers counted
    ablation = row(spec, CPU_LIKE, 0.0, "after_forward", 1024, rate_mbit, False, measured, None)
    assert ablation["line_transfer_ms"] == pytest.approx(300)
    assert ablation["floor_ms"] == pytest.approx(ablation["line_transfer_ms"])  # the ablation's floor is T
    assert ablation["kv_goodput_fraction"] == pytest.approx(TCP_PAYLOAD_SHARE)  # all of what TCP can carry
    assert ablation["exposed_over_floor"] == pytest.approx(1.0)  # judged from the forward's end
    streaming = row(spec, CPU_LIKE, 0.0, "streaming", 1024, rate_mbit, False, measured, ablation)
    assert streaming["kv_goodput_fraction"] is None
    assert streaming["floor_ms"] == pytest.approx(300 - 100 + 75)  # T - C + T/L with L = 4
    assert streaming["exposed_over_floor"] == pytest.approx(330 / 275)  # judged from the last layer
    assert streaming["strict_floor_ms"] == pytest.approx(300 - 100 + 25)  # T - C + C/L
    assert ablation["strict_floor_ms"] == ablation["floor_ms"]
    assert streaming["ttft_penalty_ms"] == pytest.approx(0.0)


def _row(mode, reference, goodput, per_layer, over_floor, error):
    return {"mode": mode, "reference": reference, "kv_goodput_fraction": goodput, "kv_bytes_per_layer": per_layer,
            "exposed_over_floor": over_floor, "exposed_over_strict_floor": over_floor * 1.1, "sim_ttft_error": error}


def test_the_summary_reads_only_the_shaped_rows_the_issue_judges():
    rows = [_row("streaming", True, None, 4 << 20, 9.0, 0.0),  # reference rows never count
            _row("streaming", False, None, 4 << 20, 1.1, -0.05),
            _row("after_forward", False, 0.9, 4 << 20, 1.05, 0.08),
            _row("after_forward", False, 0.5, 512 << 10, 2.0, 0.01)]  # under 1 MiB a layer: no goodput figure
    assert summarize(rows) == {"min_kv_goodput_fraction": 0.9, "max_streaming_exposed_over_floor": 1.1,
                               "min_streaming_exposed_over_floor": 1.1,
                               "max_streaming_exposed_over_strict_floor": pytest.approx(1.21),
                               "max_abs_sim_ttft_error": 0.08}
    assert set(summarize([]).values()) == {None}
