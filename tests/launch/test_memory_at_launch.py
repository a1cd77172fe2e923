"""Launch and memory (issue 35): nothing starts that does not fit; expert parallelism is planned, not yet run."""

import logging
from pathlib import Path

import attrs
import pytest

from disaggsdk.errors import SpecError
from disaggsdk.launch.tiny import ExpertParallelismUnavailable, check_runnable, tiny_note, tiny_spec
from disaggsdk.plan import make_plan
from disaggsdk.spec import load_spec, spec_from_dict

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_runs_an_expert_parallel_spec_with_ep_1_and_says_so(caplog):
    spec = load_spec(ROOT / "specs" / "r1_dp.yaml")
    assert spec.decode.ep == 8
    note = tiny_note(spec)
    assert note == ("--tiny: decode.ep: 8 ep dropped to 1: each tiny unit holds every expert until expert "
                    "parallelism lands (issue 36)")
    with caplog.at_level(logging.INFO, logger="disaggsdk.launch.tiny"):
        small = tiny_spec(spec)
    assert note in caplog.text
    assert (small.prefill.ep, small.decode.ep, small.engine.dtype) == (1, 1, "float32")
    assert tiny_note(small) is None and tiny_note(load_spec(ROOT / "specs" / "r1_tp.yaml")) is None
    assert small.kv.dtype == "float32"
    assert tiny_spec(attrs.evolve(spec, kv=attrs.evolve(spec.kv, dtype="fp8"))).kv.dtype == "fp8"  # CPU units store fp8
    check_runnable(small)  # a CPU spec with ep 1 runs
    assert make_plan(small).memory_problems == []  # every tiny rank holds all 8 experts and fits


def test_a_real_device_launch_of_ep_is_refused_with_a_typed_error(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the devices are there: ep is what is missing
    spec = load_spec(ROOT / "specs" / "r1_dp.yaml")
    with pytest.raises(ExpertParallelismUnavailable, match=r"decode.ep: 8 partitions the routed experts.*--tiny"):
        check_runnable(spec)
    cpu = spec_from_dict({"model": "qwen3-coder-tiny", "device": "cpu", "hardware": {"gpu": "cpu"},
                          "decode": {"tp": 2, "ep": 2}})
    with pytest.raises(ExpertParallelismUnavailable, match="issue 36"):
        check_runnable(cpu)


def test_the_runtime_refuses_a_plan_that_does_not_fit_before_starting_anything():
    from disaggsdk.launch import LocalRuntime

    spec = spec_from_dict({"model": "qwen3-coder-tiny", "device": "cpu", "hardware": {"gpu": "cpu"},
                           "kv": {"dtype": "float32"}, "engine": {"num_pages": 4096}})
    with pytest.raises(SpecError, match=r"\$\.engine\.num_pages: prefill rank 0's 4096 pages"):
        LocalRuntime(spec)
    fits = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, cpu_memory_gb=1.0))
    runtime = LocalRuntime(fits)  # constructing plans only; start() would spawn the units
    assert runtime.plan.memory[0].ranks[0].num_pages == 4096
