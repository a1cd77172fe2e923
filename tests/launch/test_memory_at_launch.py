"""Launch and memory (issues 35, 36): nothing starts that does not fit; expert-parallel specs run on the CPU."""

from pathlib import Path

import attrs
import pytest

from disaggsdk.errors import SpecError
from disaggsdk.launch.tiny import tiny_spec
from disaggsdk.plan import make_plan
from disaggsdk.spec import load_spec, spec_from_dict

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_keeps_an_expert_parallel_spec_expert_parallel():
    spec = load_spec(ROOT / "specs" / "r1_dp.yaml")
    assert (spec.prefill.ep, spec.decode.ep) == (8, 8)
    small = tiny_spec(spec)
    assert (small.prefill.ep, small.decode.ep, small.engine.dtype, small.kv.dtype) == (8, 8, "float32", "float32")
    assert tiny_spec(attrs.evolve(spec, kv=attrs.evolve(spec.kv, dtype="fp8"))).kv.dtype == "fp8"  # CPU units store fp8
    plan = make_plan(small)
    assert plan.memory_problems == []
    # deepseek-r1-tiny has 8 routed experts: one whole expert per rank of each instance
    for mem in plan.memory:
        assert [r.experts for r in mem.ranks] == [(e, e + 1) for e in range(8)]


def test_the_runtime_refuses_a_plan_that_does_not_fit_before_starting_anything():
    from disaggsdk.launch import start_local_runtime

    spec = spec_from_dict({"model": "qwen3-coder-tiny", "device": "cpu", "hardware": {"gpu": "cpu"},
                           "kv": {"dtype": "float32"}, "engine": {"num_pages": 4096}})
    with pytest.raises(SpecError, match=r"\$\.engine\.num_pages: prefill rank 0's 4096 pages"):
        start_local_runtime(spec)
    fits = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, cpu_memory_gb=1.0))
    runtime = start_local_runtime(fits)  # constructing plans only; start() would spawn the units
    assert runtime.plan.memory[0].ranks[0].num_pages == 4096
