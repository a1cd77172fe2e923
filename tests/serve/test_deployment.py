"""Deployment lifecycle: nothing left running after shutdown; the serve/launch commands end cleanly."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

from tests.conftest import start_cli_server
from tests.declared_skips import gpu_present


def our_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(("engine-", "http-server", "dashboard"))}


def test_deployment_context_manager_leaves_nothing_running():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=64), port=0) as d:
        url = d.url
        dash = d.dashboard(interval_s=0.05)
        assert d.generate([256, 5, 6], max_tokens=3, ignore_eos=True) is not None
        m = d.metrics()
        assert m.num_served == 1 and m.rows[0].name == "mixed-0" and m.row("mixed-0").num_requests == 1
        assert "mixed-0" in m._repr_html_() and "mixed-0" in str(m) and m.frame().loc["mixed-0", "num_requests"] == 1
        rows = dash.refresh()
        assert rows[0].num_requests == 1 and "<circle" in dash.plot_svg
        assert our_threads()
    assert not d.alive and not our_threads()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)
    d.shutdown()  # idempotent


def test_bench_takes_request_rate_as_the_cli_names_it_and_prints_its_table():
    """``request_rate`` is ``--request-rate``'s (and vLLM's) name; ``qps`` still works, with a
    DeprecationWarning; the result is vLLM's dict and prints as the table ``disaggsdk bench`` prints."""
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=64), port=0) as d:
        result = d.bench(num_prompts=3, request_rate=50.0, input_len=16, output_len=2, seed=1)
        assert result["completed"] == 3 and result["request_rate"] == 50.0
        text = str(result)
        assert text.splitlines()[0] == "benchmark" and "completed" in text and "median_ttft_ms" in text
        assert d.name in text and "{" not in text
        with pytest.warns(DeprecationWarning, match="request_rate"):
            old = d.bench(num_prompts=2, qps=40.0, input_len=16, output_len=2, seed=1)
        assert old["completed"] == 2 and old["request_rate"] == 40.0
        with pytest.raises(TypeError, match="request_rate only"):
            d.bench(num_prompts=2, request_rate=10.0, qps=10.0)
        assert d.metrics().num_served == 5  # the refused call sent nothing


@pytest.mark.slow  # nine units start to say so; tests/launch/test_cuda_units.py runs the two-unit case by default
def test_gpu_spec_without_cuda_says_so_from_its_units_before_loading(run_cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip(gpu_present("checks what a machine without CUDA says"))
    p = run_cli("launch", "specs/r1_dp.yaml", "--port", "0", "--no-live")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "no CUDA device" in p.stderr and "--tiny" in p.stderr
    assert "loading" not in p.stdout  # no unit began on R1's weights


def test_serve_command_serves_until_sigterm_and_exits_cleanly():
    proc, url = start_cli_server("serve", "--model", "qwen3-coder-tiny", "--port", "0", "--num-pages", "64",
                                 "--no-live", timeout_s=60)
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 143, out  # terminated, after a clean shutdown
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_requests_to_a_stopped_backend_get_503_and_health_says_down():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=16), port=0) as d:
        d.backend.close()  # the engine is gone, the server still answers
        r = httpx.post(f"{d.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and "no serving instance" in r.json()["error"]["message"]
        health = httpx.get(f"{d.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "down"


def test_max_model_len_caps_requests_at_the_edge():
    """`serve --max-model-len` (EngineConfig.max_model_len) is what /v1/models lists and the edge refuses beyond."""
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=64, max_model_len=256), port=0) as d:
        (entry,) = httpx.get(f"{d.url}/v1/models").json()["data"]
        assert entry["max_model_len"] == 256
        r = httpx.post(f"{d.url}/v1/completions", json={"prompt": [1] * 250, "max_tokens": 10})
        assert r.status_code == 400 and "4 too many" in r.json()["error"]["message"]
