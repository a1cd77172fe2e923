"""The spec's serving sections: the OpenAI-compatible front end (`Serve`) and where the units run (`Launch`)."""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.field_checks import (
    CheckedFields,
    about,
    choice,
    count,
    device_ids,
    duration,
    fraction,
    http_url,
    in_range,
    key,
    port,
    section,
    served_name,
)
from disaggsdk.spec.topology import MAX_RANKS

# Connections one process can hold: Linux's default ceiling on a process's open files (fs.nr_open)
MAX_OPEN_FILES = 1 << 20
OPEN_FILES_WHY = "a process opens at most 1,048,576 files, Linux's fs.nr_open"
# CUDA device ids: a machine's devices are numbered from 0, and none has a thousand
MAX_DEVICE_ID = 1023

Backend = Literal["local", "ray"]
Routing = Literal["cache_aware", "least_loaded"]
ROUTINGS = ("cache_aware", "least_loaded")


@attrs.frozen
class Autoscale(CheckedFields):
    """Units change role (prefill <-> decode) as the load shifts, to hold the SLOs (docs/migration.md)."""

    enabled: bool = key(False,
        "Watch TTFT and TPOT attainment and move a unit between prefill and decode when one side misses its SLO "
        "and the other has room; a decode unit leaving decode hands its running requests to the others with "
        "their KV first. Decode units are built to count layers, so a unit turned prefill streams its KV layer "
        "by layer. Needs prefill and decode instances of one shape (tp, dp; no ep).")
    ttft_ms: float = key(2000.0, "The time-to-first-token SLO, in milliseconds.", duration("ms"))
    tpot_ms: float = key(200.0, "The time-per-output-token SLO (mean over a request's decode), in milliseconds.",
                         duration("ms"))
    attainment: float = key(0.9, "The share of requests that must meet each SLO over the window.", fraction)
    window_s: float = key(20.0, "Seconds of finished requests each decision looks at.", duration("s"))
    cooldown_s: float = key(20.0,
        "Seconds after a role change before the next may happen (hysteresis: the window must fill with requests "
        "served by the new layout first).", duration("s", zero=True))
    min_prefill: int = key(0, "Prefill units never fewer than this (0: decode units may prefill locally).",
                           in_range(0, 1024))
    min_decode: int = key(1, "Decode units never fewer than this.", in_range(1, 1024))


@attrs.frozen
class Serve(CheckedFields):
    """The OpenAI-compatible front end. Loopback unless you choose otherwise."""

    host: str = key("127.0.0.1", "Address the front end listens on.")
    port: int = key(8000, "TCP port of the front end; 0 picks a free one.", port)
    allowed_hosts: tuple[str, ...] = attrs.field(
        default=("localhost", "127.0.0.1", "::1"), converter=tuple,
        metadata=about("Host names the front end answers in the Host and Origin headers (any port); "
                       "`*` for any. Loopback by default, so a web page can neither post to a local server "
                       "nor rebind a DNS name to it."),
    )
    metrics_require_key: bool = key(False, "`/metrics` asks for the API key as `/v1` does.")
    model_name: str | None = key(None,
        "The model name clients send and `/v1/models` lists (vLLM's `--served-model-name`); unset: the spec's "
        "`model`.", served_name)
    routing: Routing = key("cache_aware",
        "Which decode unit takes a request. `cache_aware`: the unit already sent the prompt's prefix (whole KV "
        "pages), unless it is busier by more than the cache saves (pages to prefill plus pages in flight, as "
        "NVIDIA Dynamo's KV router weighs them); no prefix seen: the least busy. `least_loaded`: the fewest "
        "requests in flight.", choice(ROUTINGS))
    header_timeout_s: float = key(10.0,
        "Seconds a connection has to send a request's line and headers, from its opening or its next request's "
        "first byte; past it: 408 and closed, so slow clients cannot hold connections.", duration("s"))
    idle_timeout_s: float = key(5.0,
        "Seconds a kept-alive connection may wait for its next request before it is closed (uvicorn's "
        "`timeout_keep_alive`, 5 in vLLM too).", duration("s"))
    body_timeout_s: float = key(30.0,
        "Seconds a request's body has to arrive once its headers did; past it: 408, so a client that sends its "
        "body a byte at a time cannot hold a connection and a worker.", duration("s"))
    max_connections: int = key(4096,
        "Open connections (and their requests) the server holds at once; past it a new one gets 503 (uvicorn's "
        "`limit_concurrency`), so no client can take every socket.", count(MAX_OPEN_FILES, OPEN_FILES_WHY))
    max_queued_requests: int = key(1024,
        "Requests handed to the engines that have no first token yet; past it a request gets 503 with "
        "`Retry-After` at once instead of a first token minutes later (SGLang's `--max-queued-requests`). One HTTP "
        "request counts once, whatever its `n`.", count(MAX_OPEN_FILES, "each waits on a connection of its own"))
    access_log: bool = key(False,
        "One line per finished request on stdout (uvicorn's access line plus prompt and output tokens, TTFT, total "
        "time, and the prefill and decode instance that served it; `disaggsdk launch --access-log`).")
    unit_stall_s: float = key(10.0,
        "Seconds a live unit may send nothing (no tokens, no answer to the stats it is asked for every quarter of "
        "this) before it is stalled: down in `/health` and `disaggsdk_engine_healthy`, given no new requests, and "
        "its requests without a first token moved to another unit. It serves again once it speaks. Above the "
        "longest step a unit may take.", duration("s"))
    unit_unreachable_s: float = key(10.0,
        "Seconds a live unit's channel may carry nothing, not even the heartbeat a thread of the unit sends every "
        "quarter of this whatever its loop does, before it is unreachable (a cut link, a frozen process; a unit busy "
        "in a long step still beats): down in `/health`, given no new requests, its requests without a first token "
        "moved to another unit, and every other request it held ended with an error that says to retry (HTTP 503 "
        "when no unit is left to serve). It serves again once it is heard.", duration("s"))
    otlp_traces_endpoint: str | None = key(None,
        "Where each request's phases go as OpenTelemetry spans, one trace per request across the router and the "
        "units it reached (router, queue, each prefill chunk, each layer's compute and KV transfer, the counter, "
        "each decode step): an OTLP/HTTP traces URL such as `http://localhost:4318/v1/traces` (vLLM's "
        "`--otlp-traces-endpoint`). A client's W3C `traceparent` header is honoured. Unset: no tracing unless the "
        "environment sets `OTEL_TRACES_EXPORTER` (`otlp`, `console`); units then record nothing. Needs the `trace` "
        "extra (docs/tracing.md).", http_url)
    autoscale: Autoscale = section(Autoscale, "An SLO policy that changes units' roles as the load shifts.")


@attrs.frozen
class Launch(CheckedFields):
    """Where the units run: processes on this machine, or Ray actors on a cluster's nodes."""

    backend: Backend = key("local",
        "`local`: one process per unit on this machine; `ray`: one Ray actor per unit, in a placement group per "
        "instance on the node the plan says (docs/ray.md).", choice(("local", "ray")))
    address: str | None = key(None,
        "The Ray cluster (`auto`: the one `ray start` runs here; `HOST:PORT`); unset: the one running here, else a "
        "new one-node cluster. Only with `backend: ray`.")
    cuda_devices: tuple[int, ...] = attrs.field(
        default=(), converter=tuple,
        metadata=about("`device: cuda` on the local backend: this machine's CUDA device for each of the plan's GPUs, "
                       "in plan order (node 0's GPU 0, 1, ..., then node 1's); each unit gets its ranks' devices as "
                       "`CUDA_VISIBLE_DEVICES`. A repeated id puts ranks on one GPU, e.g. `[0, 0]` with "
                       "`$.hardware.gpus_per_node: 1` runs a prefill and a decode instance on GPU 0 (as two vLLM "
                       "servers with one `CUDA_VISIBLE_DEVICES`): their `$.engine.memory_utilization` must add up to "
                       "at most 1. Empty: GPU slot i on device i (needs as many devices as the plan has GPUs).",
                       device_ids(MAX_DEVICE_ID, MAX_RANKS)),
    )
