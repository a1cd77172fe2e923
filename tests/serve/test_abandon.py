"""A client that gives up before its first token: the request is aborted on decode and on prefill,
its pages come back, and /metrics counts it as an abort (real processes, real HTTP)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("torch")

from disaggsdk.face.deployment import Deployment
from disaggsdk.serve.backends.local import serve_locally
from tests.launch._helpers import make_spec


def finished_by_reason(url: str) -> dict[str, float]:
    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    return {s.labels["finished_reason"]: s.value for s in fams["disaggsdk_request_success"].samples
            if s.name.endswith("_total")}


def test_a_request_abandoned_before_its_first_token_is_aborted_everywhere():
    spec = make_spec("qwen3-coder-tiny", num_pages=64, deadline_s=60.0)
    backend = serve_locally(spec, on_event=lambda _l: None, max_restarts=0)
    with Deployment(backend, port=0) as d:
        prefill_pid = backend.runtime.units["prefill-0"].process.pid
        os.kill(prefill_pid, signal.SIGSTOP)  # the first token cannot come: the client will give up
        try:
            body = {"prompt": [5 + i % 200 for i in range(120)], "max_tokens": 8, "stream": True}
            with pytest.raises(httpx.ReadTimeout):
                with httpx.stream("POST", f"{d.url}/v1/completions", json=body, timeout=1.5) as r:
                    r.read()
            deadline = time.monotonic() + 20
            while backend.unit_stats()["decode-0"].waiting:  # the abort reached the decode unit
                assert time.monotonic() < deadline, "the abandoned request still waits for its KV"
                time.sleep(0.1)
        finally:
            os.kill(prefill_pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while True:  # the prefill unit drains what it started and every page comes back
            stats = backend.unit_stats()
            if all(s.num_free_pages == s.num_pages and s.running == 0 for s in stats.values()):
                break
            assert time.monotonic() < deadline, {n: (s.num_free_pages, s.running) for n, s in stats.items()}
            time.sleep(0.2)
        assert finished_by_reason(d.url).get("abort") == 1.0
        ok = httpx.post(f"{d.url}/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200
