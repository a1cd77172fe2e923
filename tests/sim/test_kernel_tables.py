"""Kernel costs from aiconfigurator-core's measured H200 tables (the kernels extra, installed by `make install`):
each kernel kind from its table, exact at measured points, between measured neighbours, the roofline for what
no table covers, and the account of which source answered."""

import importlib.util
import subprocess
import sys
import textwrap

import attrs
import pyarrow.parquet as pq
import pytest

from disaggsdk.models import resolve_model
from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.kernel_db import INSTALL_HINT, KernelDbRef, TableFile
from disaggsdk.sim.kernels import (
    AllReduce,
    Attention,
    Elementwise,
    ExpertExchange,
    Gemm,
    KernelTime,
    MoeExperts,
    attention_shape,
)
from disaggsdk.sim.layered_kernels import LayeredKernels, kernel_costs_for

H200 = load_profile("h200")
R1 = resolve_model("deepseek-r1")
QWEN = resolve_model("qwen3-coder")


@pytest.fixture(scope="module")
def kernels() -> LayeredKernels:
    return kernel_costs_for(H200)


def ask(costs, shape) -> KernelTime:
    """The method of ``costs`` that times ``shape``."""
    if isinstance(shape, Gemm):
        return costs.gemm(shape)
    if isinstance(shape, Attention):
        return costs.attention(shape)
    if isinstance(shape, MoeExperts):
        return costs.moe_experts(shape)
    if isinstance(shape, AllReduce | ExpertExchange):
        return costs.collective(shape)
    return costs.elementwise(shape)


def test_a_gemm_at_a_measured_point_is_the_parquet_value(kernels):
    path = kernels.tables.db.path(TableFile("gemm", "sglang", "0.5.14", "gemm_perf"))
    rows = pq.read_table(path, filters=[("gemm_dtype", "=", "fp8_block"), ("m", "=", 8192), ("n", "=", 7168),
                                        ("k", "=", 2048)]).to_pylist()
    time = kernels.gemm(Gemm(8192, 7168, 2048, "fp8_block"))
    assert time.fit == "exact"
    assert time.seconds == rows[0]["latency"] * 1e-3  # a point monotone cleaning left where it was
    assert "h200_sxm/gemm/sglang/0.5.14/gemm_perf.parquet [gemm_dtype=fp8_block]" in time.source
    assert "cleaning moved" in time.source


def test_an_off_grid_gemm_lies_between_its_measured_neighbours(kernels):
    # Qwen3-32B at TP8: n 1280 and k 3200 fall between the grid's 1024..1536 and 3072..3584; m 24 between 17 and 32
    time = kernels.gemm(Gemm(24, 1280, 3200, "fp8_block"))
    corners = [kernels.gemm(Gemm(m, n, k, "fp8_block")) for m in (17, 32) for n in (1024, 1536) for k in (3072, 3584)]
    assert time.fit == "interpolated" and all(c.fit == "exact" for c in corners)
    assert min(c.seconds for c in corners) <= time.seconds <= max(c.seconds for c in corners)
    assert kernels.gemm(Gemm(24, 1024, 3200, "fp8_block")).seconds <= time.seconds
    assert time.seconds <= kernels.gemm(Gemm(32, 1280, 3200, "fp8_block")).seconds


def test_past_the_largest_measured_m_a_gemm_keeps_the_edges_efficiency(kernels):
    edge = kernels.gemm(Gemm(32768, 7168, 2048, "fp8_block"))
    past = kernels.gemm(Gemm(65536, 7168, 2048, "fp8_block"))
    roofline = kernels.roofline.gemm
    ratio = roofline(Gemm(65536, 7168, 2048, "fp8_block")).seconds / roofline(Gemm(32768, 7168, 2048, "fp8_block")).seconds
    assert past.fit == "extrapolated"
    assert past.seconds == pytest.approx(edge.seconds * ratio)


TABLE_SHAPES = [
    (Gemm(64, 24576 // 8, 7168, "fp8_block"), "gemm/sglang/0.5.14/gemm_perf.parquet"),
    (Gemm(64, 512, 128, "fp8_block", batch=16), "mla_bmm/sglang/0.5.14/mla_bmm_perf.parquet [op_name=mla_gen_pre"),
    (Gemm(64, 128, 512, "fp8_block", batch=16), "mla_bmm/sglang/0.5.14/mla_bmm_perf.parquet [op_name=mla_gen_post"),
    (attention_shape(QWEN, "context", 8, 1, 2048, 0), "attention/sglang/0.5.14/context_attention_perf.parquet"),
    (attention_shape(QWEN, "generation", 8, 64, 1, 2000), "attention/sglang/0.5.14/generation_attention_perf.parquet"),
    (attention_shape(R1, "context", 8, 1, 2048, 0), "mla/sglang/0.5.14/context_mla_perf.parquet"),
    (attention_shape(R1, "generation", 8, 16, 1, 2048, "fp8"), "mla/sglang/0.5.14/generation_mla_perf.parquet"),
    (attention_shape(R1, "generation", 1, 8, 1, 2048, "fp8"), "num_heads=128]"),  # DP attention: all heads a rank
    (MoeExperts(64, 7168, 2048, 8, 256, moe_tp=8, dtype="fp8_block"), "moe/sglang/0.5.14/moe_perf.parquet"),
    (MoeExperts(8192, 7168, 2048, 8, 256, moe_ep=32, dtype="fp8_block", deepep=True),
     "moe/sglang/0.5.10/wideep_context_moe_perf.parquet"),
    (MoeExperts(2048, 7168, 2048, 8, 256, moe_ep=64, dtype="fp8_block", phase="generation", deepep=True),
     "moe/sglang/0.5.10/wideep_generation_moe_perf.parquet"),
    (AllReduce(8, 64 * 7168), "comm/sglang/0.5.14/custom_allreduce_perf.parquet"),
    (AllReduce(8, 64 * 7168, backend="nccl"), "comm/nccl/2.26.2/nccl_perf.parquet"),
    (ExpertExchange("dispatch", "normal", 2048, 7168, 8, 256, ranks=8), "comm/sglang/0.5.12/wideep_deepep_normal_perf.parquet"),
    (ExpertExchange("combine", "normal", 2048, 7168, 8, 256, ranks=32, nodes=4),
     "comm/sglang/0.5.6.post2/wideep_deepep_normal_perf.parquet"),
    (ExpertExchange("dispatch", "low_latency", 128, 7168, 8, 256, ranks=8), "comm/sglang/0.5.12/wideep_deepep_ll_perf.parquet"),
]


@pytest.mark.parametrize(("shape", "table"), TABLE_SHAPES, ids=lambda v: getattr(v, "kind", ""))
def test_each_kernel_kind_reads_its_table_and_says_so(kernels, shape, table):
    time = ask(kernels, shape)
    assert time.fit in ("exact", "interpolated") and time.seconds > 0
    assert table in time.source and time.source.startswith("aiconfigurator-core 0.12")
    assert table in kernels.sources()[shape.kind]


MISSES = [
    attrs.evolve(attention_shape(QWEN, "generation", 8, 64, 1, 2000), num_heads=7),  # no 7-head rows
    attrs.evolve(attention_shape(QWEN, "context", 8, 1, 2048, 0), window=4096),  # an unmeasured window
    attrs.evolve(attention_shape(R1, "generation", 8, 16, 1, 2048), kv_lora_rank=256),  # not DeepSeek's MLA widths
    Gemm(64, 256, 128, "bfloat16", batch=16),  # a batched product that is not MLA's absorption
    MoeExperts(2048, 7168, 2048, 8, 200, moe_ep=8, dtype="fp8_block", phase="generation", deepep=True),  # 200 experts: no rows
    AllReduce(16, 64 * 7168, nodes=2),  # the tables measured one node
    ExpertExchange("dispatch", "normal", 128, 7168, 8, 256, ranks=4),  # DeepEP rows are whole 8-GPU nodes
    Elementwise("rmsnorm", 64, 7168),  # no table at all
]


@pytest.mark.parametrize("shape", MISSES, ids=lambda v: v.kind)
def test_a_shape_no_table_covers_falls_back_to_the_roofline_for_that_kernel_alone(kernels, shape):
    assert ask(kernels.tables, shape) is None
    time = ask(kernels, shape)
    assert time == ask(kernels.roofline, shape)
    assert time.fit == "roofline" and time.source == "roofline (profile h200)"
    assert "roofline (profile h200) (roofline " in kernels.sources()[shape.kind]


def test_an_expert_group_of_no_measured_size_reads_the_largest_measured_one_below_at_its_tokens_a_device(kernels):
    # LMSYS's decode ran EP72; the tables measure groups of powers of two
    ep72 = MoeExperts(232 * 72, 7168, 2048, 8, 256, moe_ep=72, dtype="fp8_block", phase="generation", deepep=True)
    ep64 = attrs.evolve(ep72, moe_ep=64, num_tokens=232 * 64)
    assert kernels.tables.moe_experts(ep72) == kernels.tables.moe_experts(ep64) is not None


def test_a_prefill_chunk_after_a_cached_prefix_costs_the_difference_of_two_whole_prompts(kernels):
    def prompt(tokens):
        return kernels.attention(attention_shape(QWEN, "context", 8, 1, tokens, 0)).seconds

    chunk = kernels.attention(attention_shape(QWEN, "context", 8, 1, 2048, 4096))
    assert chunk.fit == "exact"  # 2048, 4096 and 6144 are all measured lengths
    assert chunk.seconds == pytest.approx(prompt(6144) - prompt(4096))
    assert chunk.seconds >= prompt(2048)
    tiny = kernels.attention(attention_shape(QWEN, "context", 8, 1, 16, 8192))
    assert tiny.seconds == pytest.approx(max(prompt(8192 + 16) - prompt(8192), prompt(16)))


def test_a_speculating_decode_step_reads_its_queries_as_more_sequences(kernels):
    verify = kernels.attention(attention_shape(QWEN, "generation", 8, 32, 2, 2047))
    assert verify.seconds == kernels.attention(attention_shape(QWEN, "generation", 8, 64, 1, 2047)).seconds


def test_deepep_past_the_largest_measured_node_count_extrapolates_from_it(kernels):
    eight = kernels.collective(ExpertExchange("combine", "low_latency", 128, 7168, 8, 256, ranks=64, nodes=8))
    nine = kernels.collective(ExpertExchange("combine", "low_latency", 128, 7168, 8, 256, ranks=72, nodes=9))
    assert eight.fit == "exact" and nine.fit == "extrapolated"
    assert "0.5.6.post2/wideep_deepep_ll_perf.parquet" in nine.source  # the 8-node rows, not 0.5.12's one node
    assert eight.seconds < nine.seconds < 1.1 * eight.seconds


def test_a_vllm_database_reads_vllms_tables():
    vllm = kernel_costs_for(H200, KernelDbRef("h200", "vllm", "0.24.0"))
    assert "gemm/vllm/0.24.0/gemm_perf.parquet" in vllm.gemm(Gemm(8, 6144, 5120, "fp8_block")).source
    exchange = vllm.collective(ExpertExchange("dispatch", "low_latency", 128, 7168, 8, 256, ranks=8))
    assert "comm/vllm/0.24.0/moe_a2a_perf.parquet [comm_backend=deepep_ll" in exchange.source
    assert vllm.attention(attention_shape(R1, "generation", 8, 16, 1, 2048)).fit == "roofline"  # modules only


def test_sources_count_every_call_by_how_it_was_answered():
    costs = kernel_costs_for(H200)
    for _ in range(2):
        costs.gemm(Gemm(8192, 7168, 2048, "fp8_block"))
    costs.gemm(Gemm(24, 1280, 3200, "fp8_block"))
    costs.gemm(Gemm(64, 256, 128, "bfloat16", batch=16))
    counts = costs.source_counts()
    table = next(s for s in counts["gemm"])
    assert counts["gemm"][table] == {"exact": 2, "interpolated": 1}
    assert counts["batched_gemm"] == {"roofline (profile h200)": {"roofline": 1}}
    assert costs.sources()["gemm"].endswith("(exact 2, interpolated 1)")


def test_a_gpu_without_tables_gets_the_roofline_for_every_kernel(recwarn):
    kernels = kernel_costs_for(H200, KernelDbRef("h100_pcie", "sglang", "0.5.14"))
    assert kernels.gemm(Gemm(8, 7168, 2048, "fp8_block")).fit == "roofline"
    assert "has no kernel tables" in str(recwarn.pop(UserWarning).message)


def test_without_the_package_every_kernel_is_the_roofline_and_the_warning_says_what_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, package=None: None if name == "aiconfigurator_core" else real_find_spec(name, package))
    with pytest.warns(UserWarning) as warned:
        kernels = kernel_costs_for(H200)
    message = str(warned[0].message)
    assert message == f"kernel tables need {INSTALL_HINT}; using the roofline for every kernel"
    assert "\n" not in message
    assert kernels.tables is None and kernels.notes == (message,)
    assert kernels.gemm(Gemm(8, 7168, 2048, "fp8_block")).source == "roofline (profile h200)"
    assert kernels.sources() == {"gemm": "roofline (profile h200) (roofline 1)"}


def test_a_profile_without_a_database_is_the_roofline_without_a_warning(recwarn):
    kernels = kernel_costs_for(attrs.evolve(H200, kernel_db=None))
    assert kernels.tables is None and "names no kernel database" in kernels.notes[0]
    assert not recwarn.list


def test_the_simulator_loads_no_table_library_and_kernel_costs_load_pyarrow_only_at_the_first_read():
    code = textwrap.dedent("""\
        import sys
        heavy = ("pyarrow", "pandas", "aiconfigurator_core")
        import disaggsdk.sim.simulator
        from disaggsdk.sim.hardware import load_profile
        from disaggsdk.sim.kernels import Gemm
        from disaggsdk.sim.layered_kernels import kernel_costs_for
        print(sorted(m for m in heavy if m in sys.modules))
        kernels = kernel_costs_for(load_profile("h200"))
        print(sorted(m for m in heavy if m in sys.modules))
        kernels.gemm(Gemm(8, 7168, 2048, "fp8_block"))
        print(sorted(m for m in ("pyarrow", "aiconfigurator_core") if m in sys.modules))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split("\n")[:3] == ["[]", "[]", "['pyarrow']"]
