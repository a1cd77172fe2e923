"""`disaggsdk generate --spec`: a real deployment from the shell, same tokens as the engine alone."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from tests.conftest import ROOT
from tests.declared_skips import gpu_present
from tests.launch._helpers import live_descendants

PROMPTS = [[5, 6, 7, 8, 9], [300, 2, 3] * 9, [42]]


def test_generate_with_a_spec_equals_the_engine(run_cli):
    argv = ["generate", "--spec", "specs/tiny_local.yaml", "--max-tokens", "5", "--ignore-eos", "--json"]
    for p in PROMPTS:
        argv += ["--prompt-ids", ",".join(map(str, p))]
    before = live_descendants()
    proc = run_cli(*argv, timeout_s=240)
    assert proc.returncode == 0, proc.stderr
    assert "ready: 3 units" in proc.stderr
    result = json.loads(proc.stdout)
    with LLMEngine("qwen3-coder-tiny", EngineConfig(page_size=16, num_pages=64)) as engine:
        want = [o.output_ids for o in engine.generate(PROMPTS, SamplingParams(max_tokens=5, ignore_eos=True))]
    assert [o["token_ids"] for o in result["outputs"]] == want
    assert {o["instance"] for o in result["outputs"]} <= {"decode-0", "decode-1"}
    assert result["transfer"]["prefill-0"]["transfer_writes"] > 0
    counters = {"prefix_cache_hits", "pages_not_sent", "bytes_not_sent", "requests_fully_cached"}
    assert counters <= set(result["transfer"]["decode-0"])
    assert live_descendants() <= before


def test_a_gpu_spec_without_gpus_says_what_to_run(run_cli):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip(gpu_present("checks what a machine without CUDA says"))
    # the units start and each stops at its first CUDA call (tests/launch/test_cuda_units.py has the rest)
    proc = run_cli("generate", "--spec", "specs/tiny_pd_cuda.yaml", "--prompt-ids", "1,2,3", timeout_s=120)
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "--tiny" in proc.stderr and "Traceback" not in proc.stderr


def test_tiny_maps_a_gpu_spec_to_its_tiny_model_with_the_same_topology():
    from disaggsdk.launch import tiny_spec
    from disaggsdk.plan import make_plan
    from disaggsdk.spec import load_spec

    spec = load_spec(ROOT / "specs" / "r1_dp.yaml")
    small = tiny_spec(spec)
    assert (small.model, small.device, small.kv.dtype, small.transport.provider) == (
        "deepseek-r1-tiny", "cpu", "float32", "shm")
    big, little = make_plan(spec), make_plan(small)
    assert [(i.name, i.tp, i.dp) for i in big.instances] == [(i.name, i.tp, i.dp) for i in little.instances]
    assert [r.kind for r in big.routes] == [r.kind for r in little.routes]
