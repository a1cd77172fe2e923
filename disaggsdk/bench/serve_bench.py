"""Load an OpenAI-compatible server with streamed requests and summarise what it did, as vLLM does.

Arrivals are Poisson at ``qps`` (vLLM's ``--request-rate``; gamma-distributed gaps with shape
``burstiness``: 1 is Poisson, lower is burstier), as vLLM's ``bench serve``. Each request streams
from /v1/completions or /v1/chat/completions (`serve_request`); chunks are timed as vLLM times
them (`stream_timeline`: one ITL per chunk), and the result document has vLLM's keys
(`serve_result`, `disaggsdk.report.latency.summarize`) plus a few of ours.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from disaggsdk.bench.dataset import BenchRequest
from disaggsdk.bench.multi_turn import MultiTurnWorkload
from disaggsdk.bench.serve_request import DEFAULT_REQUEST_OPTIONS, RequestOptions, headers, send
from disaggsdk.bench.serve_result import cached_token_counts, keep_percentiles_of, per_request_lists, per_second_peaks
from disaggsdk.bench.stream_timeline import StreamTimeline
from disaggsdk.bench.turn_summary import turn_summary
from disaggsdk.errors import DisaggError
from disaggsdk.report.latency import METRICS, SLO_NAMES, RequestTimeline, summarize

# a run's result: vLLM's `bench serve` document (`serve_result`) and ours beside it, whose keys vary
# with the options (the percentiles asked for, the SLOs, a multi-turn load): JSON, read by key
BenchResult = dict[str, Any]
OnDone = Callable[[RequestTimeline], None]
Load = Sequence[BenchRequest] | MultiTurnWorkload  # independent requests, or conversations


class BenchError(DisaggError):
    """The benchmark could not run (server unreachable, bad settings)."""


@dataclass(frozen=True)
class LoadShape:
    """How requests arrive."""

    qps: float = math.inf  # requests per second (vLLM's --request-rate); inf: all at once
    burstiness: float = 1.0  # gamma shape of the gaps; 1.0 is a Poisson process
    max_concurrency: int | None = None
    seed: int = 0
    num_warmups: int = 0  # untimed copies of the first request before the load (vLLM's --num-warmups)
    initial_test: bool = False  # vLLM's untimed single test request first (`disaggsdk bench` sends it)
    think_time_s: float = 0.0  # multi-turn: a user's pause between a reply and the next turn

    def __post_init__(self) -> None:
        if self.qps <= 0 or self.burstiness <= 0:
            raise BenchError(f"--request-rate ({self.qps}) and --burstiness ({self.burstiness}) must be > 0")
        if self.num_warmups < 0 or (self.max_concurrency is not None and self.max_concurrency < 1):
            raise BenchError(f"--num-warmups ({self.num_warmups}) must be >= 0 and --max-concurrency "
                             f"({self.max_concurrency}) >= 1")
        if not 0 <= self.think_time_s < math.inf:
            raise BenchError(f"--multi-turn-think-s must be a number of seconds >= 0, got {self.think_time_s}")


def arrival_gaps_s(shape: LoadShape, n: int) -> list[float]:
    """Seconds to wait after each of ``n`` sends: gamma gaps with mean ``1 / qps`` and shape
    ``burstiness`` (1: exponential, a Poisson process); all zero for an infinite rate."""
    if math.isinf(shape.qps):
        return [0.0] * n
    rng = random.Random(shape.seed)
    gaps = [rng.gammavariate(shape.burstiness, 1.0 / (shape.qps * shape.burstiness)) for _ in range(n - 1)]
    return gaps + [0.0]  # nothing to wait for after the last send


def conversations_of(load: Load) -> list[Sequence[BenchRequest]]:
    """The conversations of ``load``: a plain request list is one-turn conversations."""
    return list(load.conversations) if isinstance(load, MultiTurnWorkload) else [[req] for req in load]


async def run_load(url: str, model: str, requests: Sequence[BenchRequest], shape: LoadShape, api_key: str | None = None,
                   options: RequestOptions = DEFAULT_REQUEST_OPTIONS, on_done: OnDone | None = None,
                   on_start: Callable[[], None] | None = None) -> tuple[list[StreamTimeline], float]:
    """Send ``requests`` with the arrival process ``shape``: `run_conversations` of one turn each,
    whose returns (timelines in request order, duration) and raises it shares."""
    return await run_conversations(url, model, [[req] for req in requests], shape, api_key, options, on_done,
                                   on_start)


async def run_conversations(url: str, model: str, conversations: Sequence[Sequence[BenchRequest]], shape: LoadShape,
                            api_key: str | None = None, options: RequestOptions = DEFAULT_REQUEST_OPTIONS,
                            on_done: OnDone | None = None, on_start: Callable[[], None] | None = None,
                            warmup: BenchRequest | None = None) -> tuple[list[StreamTimeline], float]:
    """Start ``conversations`` with the arrival process ``shape``; each sends its turns in order.

    Turn k+1 is sent once turn k's response has ended and ``shape.think_time_s`` has passed, and
    then waits for a slot like any request: ``max_concurrency`` caps requests in flight, not
    conversations. A failed turn does not end its conversation (the next prompt does not depend on
    the reply). With ``shape.initial_test``, as vLLM's ``bench serve``, the first request is sent
    once alone before the timed load (it fails fast on wrong settings, and both tools then start on
    a server that has answered once; for a multi-turn load it also puts the shared system prompt in
    the server's cache, as a running chat service has it); then ``shape.num_warmups`` copies of it,
    at most ``max_concurrency`` at a time. ``warmup``, when given, is sent for the test and the warm-ups
    instead of the first request, so that no measured prompt is in the server's prefix cache before it
    is measured. ``on_start`` is called when the timed load begins.

    Returns:
        (timelines conversation by conversation, turns in order; duration in seconds from the
        first send to the last answer).
    Raises:
        BenchError: the initial test request failed.
    """
    n = len(conversations)  # at most one request per conversation is in flight
    limit = asyncio.Semaphore(shape.max_concurrency or n)
    limits = httpx.Limits(max_connections=n + 1, max_keepalive_connections=n + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits) as client:

        async def one(req: BenchRequest, timed: bool = True) -> StreamTimeline:
            async with limit:
                t = await send(client, url, model, req, options, api_key)
            if timed and on_done is not None:
                on_done(t)
            return t

        async def talk(turns: Sequence[BenchRequest]) -> list[StreamTimeline]:
            timelines = []
            for k, req in enumerate(turns):
                if k and shape.think_time_s > 0:
                    await asyncio.sleep(shape.think_time_s)
                timelines.append(await one(req))  # returns once the response has ended
            return timelines

        first = warmup or conversations[0][0]
        test = await one(first, timed=False) if shape.initial_test else None
        if test is not None and not test.ok:
            raise BenchError(f"the initial test request failed against {url} ({test.error}); "
                             f"check the model, endpoint and lengths")
        await asyncio.gather(*(one(first, timed=False) for _ in range(shape.num_warmups)))
        if on_start is not None:
            on_start()
        start = time.perf_counter()
        tasks = []
        for turns, gap_s in zip(conversations, arrival_gaps_s(shape, len(conversations))):
            tasks.append(asyncio.create_task(talk(turns)))
            if gap_s > 0:
                await asyncio.sleep(gap_s)
        timelines = [t for conversation in await asyncio.gather(*tasks) for t in conversation]
    return timelines, time.perf_counter() - start


def served_model(url: str, api_key: str | None = None) -> str:
    """The first model ``url`` serves (``/v1/models``).

    Raises:
        BenchError: the server cannot be reached or serves nothing.
    """
    try:
        r = httpx.get(f"{url}/v1/models", headers=headers(api_key), timeout=10)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchError(f"cannot list the models of {url} ({exc}); is the server up, and the API key right?") from None


def bench(url: str, requests: Load, shape: LoadShape = LoadShape(), model: str | None = None,
          api_key: str | None = None, slos_ms: dict[str, float] | None = None, on_done: OnDone | None = None,
          percentiles: Sequence[float] = (50, 90, 99), *, options: RequestOptions = DEFAULT_REQUEST_OPTIONS,
          percentile_metrics: Sequence[str] = METRICS, tokenizer_id: str | None = None,
          on_start: Callable[[], None] | None = None, warmup: BenchRequest | None = None) -> BenchResult:
    """Run a benchmark against ``url`` and return vLLM ``bench serve`` style results.

    Runs its own event loop on a fresh thread, so it works from a notebook (whose thread already
    runs a loop) as well as from the command line.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000``.
        requests: what to send (text prompts for the chat endpoint): requests, or a multi-turn
            workload whose conversations arrive as ``shape`` says.
        shape: arrival process.
        model: the model name to ask for; the server's first model when None.
        api_key: bearer token, if the server wants one.
        slos_ms: SLOs for goodput, e.g. ``{"ttft": 500, "tpot": 50}``; without them
            ``request_goodput`` is None, as vLLM writes it.
        on_done: called (on the benchmark's thread) as each request ends, for progress bars.
        percentiles: which percentiles to report (vLLM's ``--metric-percentiles``).
        options: endpoint, temperature, ignore_eos.
        percentile_metrics: the metrics whose percentiles are reported (vLLM's ``--percentile-metrics``).
        tokenizer_id: recorded as ``tokenizer_id`` (the tokenizer the prompts were made with).
        on_start: called (on the benchmark's thread) when the timed load begins, after the
            untimed initial test request and warm-ups.
        warmup: the request the initial test and warm-ups send (None: the first of ``requests``).
    Returns:
        vLLM's result keys (`serve_result`) plus the run's settings, ``failed``, ``send_times_s``
        and ``client_cpu_s``, the CPU time of this process during the load: the client's alone when
        it has a process of its own, as `disaggsdk bench` has; ``total_cached_tokens`` and
        ``cached_token_ratio`` when the server reported cached prompt tokens; for a multi-turn
        workload its ``multi_turn`` block (``num_prompts`` counts requests, not conversations):
        the workload (`MultiTurnWorkload.describe`) and the run by turn (`turn_summary.turn_summary`).
    Raises:
        BenchError: the server is unreachable, a token-id prompt for the chat endpoint, the
            initial test request or every request failed.
    """
    conversations = conversations_of(requests)
    if options.chat and not all(isinstance(r.prompt, str) for turns in conversations for r in turns):
        raise BenchError("the chat endpoint needs text prompts; decode token-id prompts with the model's tokenizer")
    url = url.rstrip("/")
    model = model or served_model(url, api_key)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = asyncio.run(
                run_conversations(url, model, conversations, shape, api_key, options, on_done, on_start, warmup))
        except BaseException as exc:  # noqa: BLE001 - whatever ended the load is re-raised in the caller's thread
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
    from disaggsdk.records.host_cpu import host_cpu

    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": options.backend,
        "backend": options.backend, "label": None, "model_id": model, "tokenizer_id": tokenizer_id or model,
        "num_prompts": len(timelines), "request_rate": "inf" if math.isinf(shape.qps) else shape.qps,
        "burstiness": shape.burstiness, "max_concurrency": shape.max_concurrency,
        "endpoint": options.endpoint, "temperature": options.temperature, "ignore_eos": options.ignore_eos,
        # the client's machine: where the server ran too, for a spec launched here (every figure says where)
        "cpu": host_cpu().as_json(),
    }
    summary = summarize(timelines, duration_s, percentiles, slos_ms)
    result |= {"request_goodput": None} | keep_percentiles_of(summary, percentile_metrics)
    result |= per_request_lists(timelines) | per_second_peaks(timelines) | {"client_cpu_s": client_cpu_s}
    result |= cached_token_counts(timelines)
    if isinstance(requests, MultiTurnWorkload):
        result["multi_turn"] = (requests.describe() | {"think_time_s": shape.think_time_s}
                                | dict(turn_summary(conversations, timelines)))
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


def _slo(flag: str, entry: str, name: str, value: str, example: str) -> tuple[str, float]:
    name = name.strip()
    if name not in SLO_NAMES:
        raise BenchError(f"{flag} {entry!r}: use ttft, tpot or e2el, e.g. {flag} {example} (ms)")
    try:
        limit_ms = float(value)
    except ValueError:
        raise BenchError(f"{flag} {entry!r}: the value must be a number of milliseconds") from None
    if limit_ms < 0:
        raise BenchError(f"{flag} {entry!r}: a limit cannot be negative")
    return name, limit_ms


def parse_slos(text: str | None) -> dict[str, float]:
    """Our ``--slo`` syntax: ``"ttft=500,tpot=50"`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds).

    Raises:
        BenchError: a malformed entry, an unknown metric or a negative limit.
    """
    return dict(_slo("--slo", part, *part.partition("=")[::2], "ttft=500,tpot=50")
                for part in filter(None, (text or "").split(",")))


def parse_goodput(entries: Sequence[str] | None) -> dict[str, float]:
    """vLLM's ``--goodput`` syntax: ``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (ms).

    Raises:
        BenchError: an entry without ``KEY:VALUE``, an unknown metric or a negative limit.
    """
    slos: dict[str, float] = {}
    for entry in entries or ():
        name, sep, value = entry.partition(":")
        if not sep:
            raise BenchError(f"--goodput {entry!r}: give KEY:MS pairs, e.g. --goodput ttft:500 tpot:50")
        slos.update([_slo("--goodput", entry, name, value, "ttft:500 tpot:50")])
    return slos
