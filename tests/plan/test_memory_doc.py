"""docs/memory.md's hand computation from config.json agrees with the plan within 2% (issue 35)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from disaggsdk.plan import make_plan
from disaggsdk.spec import spec_from_dict

DOC = Path(__file__).resolve().parents[2] / "docs" / "memory.md"

# the deployments the summary table's rows name
CASES = {
    "r1 tp8 h200": {"model": "deepseek-r1", "prefill": {"tp": 8}, "decode": {"tp": 8}, "kv": {"page_size": 64}},
    "r1 dp8 ep8 h200": {"model": "deepseek-r1", "prefill": {"tp": 8}, "decode": {"tp": 1, "dp": 8, "ep": 8},
                        "kv": {"page_size": 64}},
    "qwen3-coder tp8 h200 0.95": {"model": "qwen3-coder", "prefill": {"tp": 8}, "decode": {"tp": 8},
                                  "engine": {"memory_utilization": 0.95}},
    "qwen3-coder-fp8 tp8 h200": {"model": "qwen3-coder-fp8", "prefill": {"tp": 8}, "decode": {"tp": 8}},
    "qwen3-coder-fp8 tp8 h100": {"model": "qwen3-coder-fp8", "hardware": {"gpu": "h100"}, "prefill": {"tp": 8},
                                 "decode": {"tp": 8}},
}


def _summary_rows() -> dict[str, list[float]]:
    text = DOC.read_text()
    table = text[text.index("## Summary"):]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in CASES:
            rows[cells[0]] = [float(c.replace(",", "")) for c in cells[1:]]
    return rows


def test_the_doc_lists_every_case():
    assert sorted(_summary_rows()) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plan_agrees_with_the_hand_computation(case):
    weights_gb, workspace_gb, kv_gb, tokens, requests_2k, requests_8k = _summary_rows()[case]
    data = {**CASES[case]}
    data["engine"] = {"dtype": "bfloat16", **data.get("engine", {})}
    plan = make_plan(spec_from_dict(data))
    assert plan.memory_problems == []
    decode = plan.memory[-1]
    rank = decode.ranks[0]
    assert rank.weights.total / 1e9 == pytest.approx(weights_gb, rel=0.02)
    assert rank.workspace_bytes / 1e9 == pytest.approx(workspace_gb, rel=0.02)
    assert rank.free_bytes / 1e9 == pytest.approx(kv_gb, rel=0.02)
    assert rank.kv_tokens == pytest.approx(tokens, rel=0.02)
    assert decode.requests_at(2048) == pytest.approx(requests_2k, rel=0.02)
    assert decode.requests_at(8192) == pytest.approx(requests_8k, rel=0.02)


def test_the_refusals_the_doc_describes():
    bf16 = {"dtype": "bfloat16"}
    r1_h100 = make_plan(spec_from_dict({"model": "deepseek-r1", "hardware": {"gpu": "h100"}, "engine": bf16,
                                        "prefill": {"tp": 8}, "decode": {"tp": 8}}))
    assert any("needs 85.1 GB of weights" in p and "72.0 GB" in p for p in r1_h100.memory_problems)
    qwen = make_plan(spec_from_dict({"model": "qwen3-coder", "engine": bf16, "prefill": {"tp": 8},
                                     "decode": {"tp": 8}}))
    assert any(re.search(r"holds 112,736 tokens .* 262,144 tokens .*engine.max_model_len: 112640", p)
               for p in qwen.memory_problems)
    capped = make_plan(spec_from_dict({"model": "qwen3-coder", "prefill": {"tp": 8}, "decode": {"tp": 8},
                                       "engine": {"max_model_len": 65536}}))  # `auto`: bfloat16 on CUDA
    assert capped.memory_problems == []
