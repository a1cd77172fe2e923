"""lm-eval's requests on a disaggregated deployment (1 prefill tp 2 : 1 decode): a loglikelihood
request (``echo``, ``logprobs: 1``, ``max_tokens`` 1 or 0) answers prompt logprobs equal to transformers'
float32 ones on the same shipped checkpoint (the prefill unit scores the prompt, the router puts
the scores in front of the decode unit's tokens), and ``n: 4`` with a seed repeats."""

from __future__ import annotations

import httpx
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from disaggsdk.face.deployment import launch  # noqa: E402
from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402

MODEL = "qwen3-tiny"
TEXTS = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i * i)", "import os\nimport sys"]


def reference(prompts: list[list[int]]) -> list[list[float]]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(shipped_checkpoint(MODEL), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            lp = hf(torch.tensor([p])).logits[0, :-1].float().log_softmax(-1)
            out.append([float(lp[i, p[i + 1]]) for i in range(len(p) - 1)])
    return out


def test_loglikelihood_and_seeded_n_on_a_disaggregated_deployment():
    tok = transformers.AutoTokenizer.from_pretrained(shipped_checkpoint(MODEL))
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    want = reference(prompts)
    before = live_descendants()
    spec = make_spec(MODEL, prefill_tp=2, num_pages=256, budget=8)  # chunks of 8: scores cross chunks
    with launch(spec, port=0, max_restarts=0) as d:
        url = f"{d.url}/v1/completions"
        body = {"model": d.model_name, "prompt": prompts, "echo": True, "logprobs": 1, "temperature": 0}
        scored = httpx.post(url, json=body | {"max_tokens": 1}, timeout=120).json()
        alone = httpx.post(url, json=body | {"max_tokens": 0}, timeout=120).json()
        seeded = {"model": d.model_name, "prompt": "def main():", "n": 4, "seed": 5, "temperature": 1.0,
                  "max_tokens": 8, "ignore_eos": True}
        first, again = (httpx.post(url, json=seeded, timeout=120).json() for _ in range(2))
        stats = d.backend.unit_stats()
    # the prompts were computed (and scored) by the prefill unit, not by the decode unit itself
    assert sum(s.counters.prefilled_locally for s in stats.values()) == 0
    assert sum(s.counters.transfer_bytes for s in stats.values() if s.role == "prefill") > 0
    for k, p in enumerate(prompts):
        lps = scored["choices"][k]["logprobs"]
        assert lps["token_logprobs"][0] is None and len(lps["token_logprobs"]) == len(p) + 1
        assert lps["token_logprobs"][1 : len(p)] == pytest.approx(want[k], abs=1e-4)
        assert alone["choices"][k]["logprobs"]["token_logprobs"] == lps["token_logprobs"][:-1]
    assert alone["usage"]["completion_tokens"] == 0
    texts = [c["text"] for c in first["choices"]]
    assert texts == [c["text"] for c in again["choices"]] and len(set(texts)) > 1
    assert live_descendants() <= before
