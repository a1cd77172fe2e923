"""Load an OpenAI-compatible server with streamed completions and summarise what it did.

Arrivals are Poisson at ``qps`` (gamma-distributed gaps with shape ``burstiness``: 1 is Poisson,
lower is burstier), as vLLM's ``bench serve``. Each request streams from ``/v1/completions``;
token times come from the chunks (our server tags each chunk with its token ids, so batched
tokens are counted right). Results use vLLM's field names (`disaggsdk.report.latency.summarize`).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import httpx

from disaggsdk.bench.dataset import BenchRequest
from disaggsdk.errors import DisaggError
from disaggsdk.report.latency import RequestTimeline, summarize

OnDone = Callable[[RequestTimeline], None]


class BenchError(DisaggError):
    """The benchmark could not run (server unreachable, bad settings)."""


@dataclass(frozen=True)
class LoadShape:
    """How requests arrive."""

    qps: float = math.inf  # inf: all at once
    burstiness: float = 1.0  # gamma shape of the gaps; 1.0 is a Poisson process
    max_concurrency: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.qps <= 0 or self.burstiness <= 0:
            raise BenchError(f"--qps ({self.qps}) and --burstiness ({self.burstiness}) must be > 0")


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _send(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest, api_key: str | None,
                temperature: float) -> RequestTimeline:
    payload = {
        "model": model, "prompt": req.prompt, "max_tokens": req.output_len, "temperature": temperature,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
    }
    t = RequestTimeline(time.monotonic(), prompt_tokens=req.prompt_len)
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=payload, headers=_headers(api_key)) as r:
            if r.status_code != 200:
                t.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return t
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                now = time.monotonic()
                if "error" in chunk:
                    t.error = str(chunk["error"].get("message", chunk["error"]))
                for choice in chunk.get("choices", ()):
                    # a server without token ids: one token per non-empty text chunk (vLLM's count)
                    n = len(choice.get("token_ids") or ()) or (1 if choice.get("text") else 0)
                    t.token_times_s.extend([now] * n)
                if chunk.get("usage"):
                    t.prompt_tokens = chunk["usage"].get("prompt_tokens", t.prompt_tokens)
    except httpx.HTTPError as exc:
        t.error = f"{type(exc).__name__}: {exc}"
    return t


def arrival_gaps_s(shape: LoadShape, n: int) -> list[float]:
    """Seconds to wait after each of ``n`` sends: gamma gaps with mean ``1 / qps`` and shape
    ``burstiness`` (1: exponential, a Poisson process); all zero for an infinite rate."""
    if math.isinf(shape.qps):
        return [0.0] * n
    rng = random.Random(shape.seed)
    gaps = [rng.gammavariate(shape.burstiness, 1.0 / (shape.qps * shape.burstiness)) for _ in range(n - 1)]
    return gaps + [0.0]  # nothing to wait for after the last send


async def run_load(
    url: str, model: str, requests: Sequence[BenchRequest], shape: LoadShape, api_key: str | None = None,
    temperature: float = 0.0, on_done: OnDone | None = None,
) -> tuple[list[RequestTimeline], float]:
    """Send ``requests`` with the arrival process ``shape``.

    Returns:
        (timelines in request order, duration in seconds from the first send to the last answer).
    """
    limit = asyncio.Semaphore(shape.max_concurrency or len(requests))
    limits = httpx.Limits(max_connections=len(requests) + 1, max_keepalive_connections=len(requests) + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits) as client:

        async def one(req: BenchRequest) -> RequestTimeline:
            async with limit:
                t = await _send(client, url, model, req, api_key, temperature)
            if on_done is not None:
                on_done(t)
            return t

        start = time.monotonic()
        tasks = []
        for req, gap_s in zip(requests, arrival_gaps_s(shape, len(requests))):
            tasks.append(asyncio.create_task(one(req)))
            if gap_s > 0:
                await asyncio.sleep(gap_s)
        timelines = list(await asyncio.gather(*tasks))
    return timelines, time.monotonic() - start


def served_model(url: str, api_key: str | None = None) -> str:
    """The first model ``url`` serves (``/v1/models``).

    Raises:
        BenchError: the server cannot be reached or serves nothing.
    """
    try:
        r = httpx.get(f"{url}/v1/models", headers=_headers(api_key), timeout=10)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchError(f"cannot list the models of {url} ({exc}); is the server up, and the API key right?") from None


def bench(
    url: str, requests: Sequence[BenchRequest], shape: LoadShape = LoadShape(), model: str | None = None,
    api_key: str | None = None, slos_ms: dict[str, float] | None = None, on_done: OnDone | None = None,
    percentiles: Sequence[float] = (50, 90, 99),
) -> dict[str, Any]:
    """Run a benchmark against ``url`` and return vLLM ``bench serve`` style results.

    Runs its own event loop on a fresh thread, so it works from a notebook (whose thread already
    runs a loop) as well as from the command line.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000``.
        requests: what to send.
        shape: arrival process.
        model: the model name to ask for; the server's first model when None.
        api_key: bearer token, if the server wants one.
        slos_ms: SLOs for goodput, e.g. ``{"ttft": 500, "tpot": 50}``.
        on_done: called (on the benchmark's thread) as each request ends, for progress bars.
        percentiles: which percentiles to report.
    Returns:
        the summary fields plus the run's settings, per-request lists (seconds, as vLLM) and
        ``client_cpu_s``, the CPU time of this process during the load: the client's alone when it
        has a process of its own, as `disaggsdk bench` has.
    Raises:
        BenchError: the server is unreachable or every request failed.
    """
    url = url.rstrip("/")
    model = model or served_model(url, api_key)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = asyncio.run(run_load(url, model, requests, shape, api_key, on_done=on_done))
        except BaseException as exc:  # handed to the caller's thread below
            box["exc"] = exc

    thread = threading.Thread(target=work, name="bench-load")
    cpu_before_s = time.process_time()
    thread.start()
    thread.join()
    client_cpu_s = time.process_time() - cpu_before_s  # what this client cost the machine it ran on
    if "exc" in box:
        raise box["exc"]
    timelines, duration_s = box["out"]
    if not any(t.ok for t in timelines):
        errors = {t.error for t in timelines if t.error}
        raise BenchError(f"every request failed against {url}: {sorted(errors)[:3]}")
    result: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"), "backend": "openai", "model_id": model,
        "num_prompts": len(requests), "request_rate": "inf" if math.isinf(shape.qps) else shape.qps,
        "burstiness": shape.burstiness, "max_concurrency": shape.max_concurrency,
    }
    result |= summarize(timelines, duration_s, percentiles, slos_ms)
    first_send = min(t.sent_s for t in timelines)
    result |= {
        "send_times_s": [t.sent_s - first_send for t in timelines],  # a trace for `disaggsdk simulate`
        "input_lens": [t.prompt_tokens for t in timelines],
        "output_lens": [t.output_tokens for t in timelines],
        "ttfts": [t.ttft_ms / 1e3 if t.ok else 0.0 for t in timelines],
        "itls": [[x / 1e3 for x in t.itls_ms] if t.ok else [] for t in timelines],
        "errors": [t.error or "" for t in timelines],
        "client_cpu_s": client_cpu_s,
    }
    return result


def median_run(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median (the upper one for an even count), with every run's
    value of ``key`` added as ``repeat_<key>`` (in run order) when there are several.

    Raises:
        ValueError: no runs.
    """
    if not runs:
        raise ValueError("median_run needs at least one run")
    chosen = dict(sorted(runs, key=lambda r: r[key])[len(runs) // 2])
    if len(runs) > 1:
        chosen[f"repeat_{key}"] = [r[key] for r in runs]
    return chosen


def parse_slos(text: str | None) -> dict[str, float]:
    """``"ttft=500,tpot=50"`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds).

    Raises:
        BenchError: a malformed entry or an unknown metric.
    """
    slos: dict[str, float] = {}
    for part in filter(None, (text or "").split(",")):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in ("ttft", "tpot", "e2el"):
            raise BenchError(f"--slo {part!r}: use ttft, tpot or e2el, e.g. --slo ttft=500,tpot=50 (ms)")
        try:
            slos[name] = float(value)
        except ValueError:
            raise BenchError(f"--slo {part!r}: the value must be a number of milliseconds") from None
    return slos
