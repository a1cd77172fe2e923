"""A real disaggregated deployment (`start_local_runtime`: prefill and decode processes, KV over shm) behind
the server: the openai client streams through it, /metrics counts it, the benchmark runs against
it, and the Deployment leaves no process behind."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from disaggsdk.spec import load_spec
from tests.conftest import ROOT


def child_pids() -> set[int]:
    """Live (non-zombie) processes whose parent is this test process.

    multiprocessing's resource tracker is left out: Python starts one per parent with the first
    spawned child and it ends with the parent, not with the children.
    """
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z" and b"resource_tracker" not in cmdline:
                out.add(int(entry))
    return out


@pytest.mark.deps_smoke  # make test-latest / test-oldest (tools/deps_check.py)
def test_launched_deployment_serves_counts_benchmarks_and_leaves_no_process():
    openai = pytest.importorskip("openai")
    from disaggsdk.face.deployment import launch

    before = child_pids()
    with launch(load_spec(ROOT / "specs/tiny_local.yaml"), port=0, max_restarts=0) as d:
        assert len(child_pids() - before) >= 3  # one process per unit
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused")
        stream = client.chat.completions.create(
            model=d.model_name, messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
        assert chunks[-1].usage.completion_tokens == 8
        assert {c.choices[0].finish_reason for c in chunks if c.choices} >= {"length"}
        result = d.bench(num_prompts=6, request_rate=20, input_len=64, output_len=8, seed=2)
        assert result["completed"] == 6 and result["total_output_tokens"] == 48
        text = httpx.get(f"{d.url}/metrics").text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        ttft = fams["disaggsdk_time_to_first_token_seconds"]
        count = sum(s.value for s in ttft.samples if s.name.endswith("_count"))
        assert count == 7 == d.server_metrics.num_served
        served_by = {s.labels["engine"] for s in ttft.samples if s.name.endswith("_count")}
        assert served_by <= {"decode-0", "decode-1"}  # tokens come from decode instances only
        # logprobs come back from the decode units through the router
        body = {"prompt": "x", "logprobs": 2, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        lp = httpx.post(f"{d.url}/v1/completions", json=body).json()["choices"][0]["logprobs"]
        assert len(lp["token_logprobs"]) == 4 and all(1 <= len(top) <= 2 for top in lp["top_logprobs"])  # text keys may collide
        assert all(v <= 0.0 for v in lp["token_logprobs"])
        # sampling settings cross the unit channel: a +100 logit bias decides every greedy token
        biased = httpx.post(f"{d.url}/v1/completions", json={"prompt": "x", "max_tokens": 4, "temperature": 0,
                                                            "logit_bias": {"9": 100}, "frequency_penalty": 0.5,
                                                            "min_tokens": 4, "return_token_ids": True}).json()
        assert biased["choices"][0]["token_ids"] == [9, 9, 9, 9]
        roles = {r.name: r.role for r in d.metrics().rows}
        assert roles == {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
        # a dead prefill unit: still serving (decode retries or prefills locally), and /health says so
        d.backend.runtime.kill_unit("prefill-0")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and httpx.get(f"{d.url}/health").json()["status"] == "ok":
            time.sleep(0.1)
        health = httpx.get(f"{d.url}/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["instances"]["prefill-0"] == "down"
        assert not d.metrics().row("prefill-0").healthy
    assert not (child_pids() - before)
