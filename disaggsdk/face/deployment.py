"""`Deployment`: a running backend behind the OpenAI-compatible server, as one Python object.

    with Cluster.from_yaml("specs/tiny_local.yaml").launch(port=0) as d:
        print(d.generate("def fib(n):"))

`launch` starts a whole deployment (local processes or Ray, as `$.launch.backend` says) behind a
`serve.routing.router.Router`; `serve_model` one colocated engine in this process.
"""

from __future__ import annotations

import math
import socket
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from disaggsdk.serve.http.http_guard import LOOPBACK_HOSTS
from disaggsdk.serve.http.http_limits import HttpLimits
from disaggsdk.serve.http.http_server import HttpServer
from disaggsdk.serve.http.openai_app import build_app
from disaggsdk.serve.metrics import ServerMetrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from disaggsdk.engine.compile_progress import CompileProgress
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.speculative.stats import SpecStats
    from disaggsdk.report.bench_report import BenchReport
    from disaggsdk.report.dashboard import Dashboard
    from disaggsdk.report.deployment_metrics import DeploymentMetrics
    from disaggsdk.report.ttft_phases import PhaseSummary
    from disaggsdk.report.waterfall import TimelineSpan
    from disaggsdk.serve.autoscale.autoscaler import AutoscaleDecision, Autoscaler
    from disaggsdk.serve.backend import LaunchedUnits, ServingBackend
    from disaggsdk.serve.moves.rebalance import RebalanceReport
    from disaggsdk.serve.moves.request_moves import DrainReport, MoveOutcome
    from disaggsdk.spec.types import Spec


def _stop(server: HttpServer, backend: ServingBackend) -> None:
    # backend first: open streams end with "abort" at once instead of holding the server's shutdown
    try:
        backend.close()
    finally:
        server.stop()


class Deployment:
    """A backend served over HTTP. Use as a context manager, or call `shutdown`.

    Args:
        backend: what produces tokens (closed by `shutdown`).
        host: interface to bind.
        port: TCP port; 0 picks a free one (see `url`).
        api_key: when set, clients must send ``Authorization: Bearer <api_key>``.
        name: shown in the live views.
        sock: a listening socket bound before the backend started (`serve.http.http_server.bind_listener`).
        allowed_hosts: the Host / Origin names answered (loopback by default; ``"*"`` for any).
        metrics_require_key: /metrics asks for ``api_key`` too.
        served_model_name: the model name clients use (default: the backend's model).
        allowed_origins: web origins whose pages may call the server (CORS; ``"*"``: any); none by default.
        limits: header and idle timeouts, the queue bound (`serve.http.http_limits`); None: the spec's defaults.
        access_log: one line per finished request on stdout (`serve.http.access_log`).
    Raises:
        ServerStartError: the port cannot be bound (the backend is closed then).
    """

    def __init__(self, backend: ServingBackend, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, name: str = "deployment", sock: socket.socket | None = None,
                 allowed_hosts: Sequence[str] = LOOPBACK_HOSTS, metrics_require_key: bool = False,
                 served_model_name: str | None = None, allowed_origins: Sequence[str] = (),
                 limits: HttpLimits | None = None, access_log: bool = False):
        self.backend = backend
        self.name = name
        self.api_key = api_key
        self._served_name = served_model_name or backend.model_name
        self.server_metrics = ServerMetrics(backend.stats, self._served_name, max_model_len=backend.max_model_len)
        app = build_app(backend, self.server_metrics, api_key, allowed_hosts=allowed_hosts,
                        metrics_require_key=metrics_require_key, served_model_name=self._served_name,
                        allowed_origins=allowed_origins, limits=limits, access_log=access_log)
        self._server = HttpServer(app, host, port, sock, limits)
        try:
            self._server.start()
        except BaseException:
            backend.close()
            raise
        # processes must not outlive the interpreter even if nobody calls shutdown
        self._finalizer = weakref.finalize(self, _stop, self._server, backend)
        self._dashboards: list[Dashboard] = []
        self._autoscaler: Autoscaler | None = None

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API (``{url}/v1/...``)."""
        return self._server.url

    @property
    def model_name(self) -> str:
        """The name clients send (``$.serve.model_name`` / ``--served-model-name``, else the model)."""
        return self._served_name

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def generate(self, prompt: str | list[int], max_tokens: int = 32, temperature: float = 0.0, **params: object) -> str:
        """Complete ``prompt`` through the HTTP endpoint (the same path a client takes).

        Args:
            prompt: text or token ids.
            max_tokens: tokens to generate at most.
            temperature: 0 is greedy.
            params: any other completions field (``top_p``, ``seed``, ``stop``...).
        Returns:
            the completion text.
        Raises:
            httpx.HTTPStatusError: the server refused the request (its body says why).
        """
        body = {"model": self.model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
        r = httpx.post(f"{self.url}/v1/completions", json=body | params, headers=self._headers(), timeout=None)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    def bench(self, num_prompts: int = 32, request_rate: float = math.inf, input_len: int = 256,
              output_len: int = 32, range_ratio: float = 0.0, burstiness: float = 1.0,
              max_concurrency: int | None = None, slos_ms: dict[str, float] | None = None, seed: int = 0,
              *, qps: float | None = None) -> BenchReport:
        """Run a benchmark against this deployment (random prompts), as ``disaggsdk bench`` does, once its
        units compiled their step (`wait_until_compiled`: a benchmark measures the compiled step, not
        the eager one a freshly launched unit serves on meanwhile).

        Args:
            num_prompts: requests to send.
            request_rate: requests per second, Poisson arrivals (``--request-rate``, vLLM's name);
                ``math.inf`` sends them all at once.
            input_len: prompt tokens per request.
            output_len: answer tokens per request.
            range_ratio: lengths drawn uniformly within ``±range_ratio`` of these.
            burstiness: the arrival gaps' gamma shape (1.0: Poisson).
            max_concurrency: requests in flight at most.
            slos_ms: SLOs for ``request_goodput``, e.g. ``{"ttft": 500, "tpot": 50}``.
            seed: seeds the prompts and the arrivals.
            qps: deprecated alias of ``request_rate`` (warns).
        Returns:
            vLLM ``bench serve`` style results (`disaggsdk.bench.serve_bench.bench`): a dict by its keys,
            the table ``disaggsdk bench`` prints by ``print`` and in a notebook.
        Raises:
            TypeError: both ``request_rate`` and ``qps`` are given.
            BenchError: a rate or burstiness <= 0, or the server cannot be reached.
        """
        from disaggsdk.bench.dataset import random_requests
        from disaggsdk.bench.serve_bench import LoadShape, bench
        from disaggsdk.report.bench_report import BenchReport

        if qps is not None:
            if request_rate != math.inf:
                raise TypeError("Deployment.bench: give request_rate only (qps is its old name)")
            warnings.warn("Deployment.bench(qps=...) is now request_rate=... (the name of `disaggsdk bench "
                          "--request-rate` and vLLM's); qps will be removed", DeprecationWarning, stacklevel=2)
            request_rate = qps
        requests = random_requests(num_prompts, input_len, output_len, range_ratio, seed)
        shape = LoadShape(request_rate, burstiness, max_concurrency, seed)
        self.wait_until_compiled()
        return BenchReport(bench(self.url, requests, shape, self.model_name, self.api_key, slos_ms), self.name)

    def compile_stages(self) -> dict[str, str | None]:
        """Each unit's step compile as it last said: None (it does not compile), "compiling" (in the
        background: it serves eagerly meanwhile), "compiled" or "compile_failed"; {} for one engine in
        this process."""
        units = self.backend.units()
        return units.compile_stages() if units is not None else {}

    def wait_until_compiled(self, timeout_s: float = 900.0) -> dict[str, str | None]:
        """Block until no unit still compiles its step in the background (engine.background_compile):
        call it before measuring the deployment's steady speed; a first start compiles for about a
        minute on 2 cores. Returns each unit's stage ("compiled", "compile_failed", None where it does
        not compile, "compiling" if ``timeout_s`` passed first); {} for one engine in this process."""
        units = self.backend.units()
        return units.wait_until_compiled(timeout_s) if units is not None else {}

    def ttft_phases(self, since_s: float = 0.0) -> PhaseSummary | None:
        """Where the TTFT of requests received since ``since_s`` (`time.monotonic()`) went, phase by
        phase (`disaggsdk.report.ttft_phases`); None for a backend that does not measure it (one engine
        in this process: it has no phases)."""
        units = self.backend.units()
        return units.ttft_phases(since_s) if units is not None else None

    def trace(self, request_id: str) -> list[TimelineSpan]:
        """The spans of a recent request's trace (router, prefill and decode units), when tracing is on
        (``$.serve.otlp_traces_endpoint``, ``OTEL_TRACES_EXPORTER``, or ``launch(..., span_exporter=...)``).

        Args:
            request_id: exactly the response's ``id`` ("cmpl-...") or the ``X-Request-Id`` its answer
                carried; a request submitted in this process without one (``generate_batch``): its id.
        Returns:
            its finished spans (`report.waterfall.TimelineSpan`); [] when tracing is off, the backend
            does not trace (one engine in this process), or the request is older than the last
            `serve.tracing.request_tracing.MAX_KEPT_TRACES` traced ones.
        """
        units = self.backend.units()
        return units.trace(request_id) if units is not None else []

    def waterfall(self, request_id: str) -> Figure:
        """A recent request's spans drawn as a waterfall (`report.waterfall.waterfall`): where its
        time went, unit by unit, each prefill chunk's layers and their transfers, each decode step.

        Raises:
            ValueError: no spans are held for ``request_id`` (see `trace`).
        """
        from disaggsdk.report.waterfall import waterfall

        spans = self.trace(request_id)
        if not spans:
            raise ValueError(f"no spans held for request {request_id!r}: tracing is off, or the request is "
                             "unknown or too old (see Deployment.trace)")
        return waterfall(spans, title=request_id)

    def spec_stats(self, wait_s: float = 2.0) -> SpecStats:
        """Speculative decoding's acceptance counters, summed over the instances that draft
        (cumulative since start; all zero without speculation), from a fresh snapshot of every
        instance (waiting ``wait_s`` at most for their answers)."""
        from disaggsdk.engine.speculative.stats import SpecStats

        total = SpecStats()
        for s in self.backend.stats(wait_s):
            c = s.counters
            total.add(SpecStats(c.spec_num_drafts, c.spec_num_draft_tokens, c.spec_num_accepted_tokens,
                                list(c.spec_accepted_per_position), list(c.spec_drafts_per_position)))
        return total

    def metrics(self, window_s: float = 30.0) -> DeploymentMetrics:
        """Live numbers: one row per instance (TTFT p50/p99, tokens/s per request, queues, KV, transfer).

        Args:
            window_s: the latencies summarise requests that ended this many seconds ago or later.

        Returns:
            a snapshot that shows as a table (HTML in Jupyter, rich in a terminal); ``.rows`` holds
            the typed rows, ``.row("decode-0")`` one of them, ``.frame()`` a pandas DataFrame.
        """
        from disaggsdk.report.deployment_metrics import DeploymentMetrics
        from disaggsdk.report.live import instance_rows

        rows = instance_rows(self.server_metrics.recent(), self.backend.stats(), time.monotonic(), window_s)
        notes = tuple(d.line() for d in self.autoscale_decisions[-3:])  # the policy's latest, under the heading
        return DeploymentMetrics(self.server_metrics.num_served, tuple(rows), self.name, notes)

    def dashboard(self, start: bool = True, interval_s: float = 1.0) -> Dashboard:
        """A live dashboard of this deployment: the instance table and TTFT / inter-token latency over time,
        redrawn in place in a notebook cell (show it as a cell's last expression). A saved notebook and its
        HTML export keep the last picture (`report.dashboard`).

        Args:
            start: refresh it every ``interval_s`` in the background (until `shutdown`).
            interval_s: seconds between two refreshes.

        Returns:
            the dashboard; ``refresh()`` redraws it now, ``snapshot_html()`` is its static picture.
        """
        from disaggsdk.report.dashboard import Dashboard

        dash = Dashboard(self.server_metrics.recent, self.backend.stats, self.name, interval_s)
        self._dashboards.append(dash)
        return dash.start() if start else dash

    # moving decoding requests between decode units (serve.moves.request_moves)

    def _router(self) -> LaunchedUnits:
        from disaggsdk.serve.moves.request_moves import MoveError

        units = self.backend.units()
        if units is None:
            raise MoveError("this deployment is one engine in one process: it has no units to move requests between")
        return units

    def move(self, request_id: str, to: str, timeout_s: float = 60.0) -> MoveOutcome:
        """Move a decoding request to decode unit ``to`` with its KV; it continues there exactly (the
        same tokens as unmoved). ``request_id``: the response's id, or the client's ``X-Request-Id``.

        Returns:
            how the move ended (``moved`` False: it went on where it was, ``reason`` says why).
        Raises:
            MoveError: the request is not in flight or not decoding yet, or ``to`` is not another
                decode unit; `LeverConflict` (one) when ``to`` is down or drained.
        """
        return self._router().move(request_id, to).result(timeout_s)

    def drain(self, unit: str, timeout_s: float = 60.0) -> DrainReport:
        """Take decode unit ``unit`` out of routing and move every request it decodes to the other
        decode units with their KV (before stopping or restarting it); `undrain` routes to it again.
        A drain that does not empty the unit in ``timeout_s`` routes to it again itself (``routed``).

        Raises:
            MoveError: ``unit`` is not a decode unit; `LeverConflict` (one) when it is the last routable
                decode unit, or no other could take its requests.
        """
        return self._router().drain(unit, timeout_s)

    def undrain(self, unit: str) -> None:
        """Route new requests to ``unit`` again after `drain`."""
        self._router().undrain(unit)

    def start_autoscaler(self, say: Callable[[str], None] = print) -> None:
        """Run the spec's `serve.autoscale` policy over this deployment (`launch` does when it is enabled):
        units change role as the SLO attainment asks; ``say`` gets each decision's line."""
        from disaggsdk.serve.autoscale.autoscaler import Autoscaler

        if self._autoscaler is None:
            self._autoscaler = Autoscaler(self._router(), self.server_metrics.recent, self.server_metrics.registry,
                                          say, self._served_name).start()

    @property
    def autoscale_decisions(self) -> list[AutoscaleDecision]:
        """The autoscale policy's decisions so far, oldest first ([] when it does not run)."""
        return list(self._autoscaler.decisions) if self._autoscaler is not None else []

    def rebalance(self, prefill: int, decode: int, drain_timeout_s: float = 60.0) -> RebalanceReport:
        """Change units' roles live until ``prefill`` of them prefill and ``decode`` decode: a decode unit
        leaving decode hands its running requests to the others with their KV first; no request fails.

        Raises:
            MoveError: the counts do not match the units, or the spec's prefill and decode instances
                differ in shape (tp, dp) or spread experts (ep); `LeverConflict` (one) when another
                rebalance runs, or the layout needs a unit that is down to change role or would leave
                no routable decode unit (nor prefill unit, where it keeps one).
        """
        from disaggsdk.serve.moves.rebalance import rebalance

        return rebalance(self._router(), prefill, decode, drain_timeout_s)

    def shutdown(self) -> None:
        """Stop the server and everything the backend started. Idempotent."""
        if self._autoscaler is not None:
            self._autoscaler.stop()
        for dash in self._dashboards:
            dash.stop()
        self._finalizer()

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"<Deployment {self.name} {self.model_name} at {self.url} ({state})>"


def fetch_trace(url: str, request_id: str, api_key: str | None = None, timeout_s: float = 10.0) -> list[TimelineSpan]:
    """The spans of a recent request's trace from a deployment running elsewhere (``disaggsdk launch``
    with tracing on), over its ``/traces/{request_id}`` route; draw them with
    `disaggsdk.report.waterfall.waterfall`.

    Args:
        url: the deployment's base URL (``http://host:port``, with or without ``/v1``).
        request_id: exactly the response's ``id`` ("cmpl-...") or the ``X-Request-Id`` its answer carried.
        api_key: the deployment's API key, if it has one.
    Returns:
        the request's finished spans; [] when the deployment holds none for it (tracing off, or the
        request unknown or too old).
    Raises:
        httpx.HTTPError: the deployment cannot be reached, or refused the key.
    """
    from disaggsdk.report.waterfall import TimelineSpan

    base = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(f"{base}/traces/{request_id}", headers=headers, timeout=timeout_s)
    if r.status_code == 404:
        return []
    r.raise_for_status()
    return [TimelineSpan(**span) for span in r.json()["spans"]]


def serve_model(model: str, engine_config: EngineConfig | None = None, host: str = "127.0.0.1", port: int = 0,
                api_key: str | None = None, on_compile: Callable[[CompileProgress], None] | None = None,
                **server_options: Any) -> Deployment:
    """One colocated engine in this process behind the server (`disaggsdk serve`).

    Args:
        model: a tiny catalog name or a checkpoint directory.
        engine_config: engine settings.
        host: see `Deployment`.
        port: see `Deployment`.
        api_key: see `Deployment`.
        on_compile: told about compiling the engine's step (`LLMEngine`), if it does.
        server_options: `Deployment`'s ``allowed_hosts``, ``metrics_require_key``, ``served_model_name``,
            ``allowed_origins``, ``limits`` and ``access_log``.
    """
    from disaggsdk.serve.backends.inprocess_backend import InProcessBackend

    backend = InProcessBackend(model, engine_config, on_compile=on_compile)
    return Deployment(backend, host, port, api_key, name=f"{model} (colocated, in process)", **server_options)


def launch(spec: Spec, tiny: bool = False, colocated: bool = False, host: str | None = None,
           port: int | None = None, api_key: str | None = None, served_model_name: str | None = None,
           allowed_origins: Sequence[str] = (), **runtime_options: Any) -> Deployment:
    """Start the processes of ``spec`` on this machine and serve them.

    Args:
        spec: a checked spec.
        tiny: run the spec's topology with the tiny variant of its model (CPU).
        colocated: the comparison layout: the same CPU budget as mixed prefill+decode instances.
        host: overrides ``spec.serve.host``.
        port: overrides ``spec.serve.port``; 0 picks a free one.
        api_key: see `Deployment`.
        served_model_name: overrides ``spec.serve.model_name``.
        allowed_origins: see `Deployment`.
        runtime_options: passed to `disaggsdk.serve.backends.local.serve_runtime`: ``span_exporter`` (trace
            every request, `Deployment.trace`, and hand its OpenTelemetry spans to this exporter as
            they end; without it requests are traced only when ``$.serve.otlp_traces_endpoint`` or
            ``OTEL_TRACES_EXPORTER`` says so: docs/tracing.md), and `disaggsdk.launch.start_local_runtime`'s
            (``cpu_affinity``, ``log_dir``).
    Raises:
        UnitCannotRun: a `device: cuda` spec without ``tiny`` on a machine without CUDA (its units
            say so before loading anything).
        ServerStartError: the port cannot be bound (checked before any unit starts).
        TracingUnavailableError: tracing is asked for but opentelemetry is missing (the ``trace`` extra).
    """
    from disaggsdk.launch.launcher.supervisor import start_runtime
    from disaggsdk.serve.backends.local import serve_runtime
    from disaggsdk.serve.http.http_server import bind_listener

    host = host or spec.serve.host
    port = spec.serve.port if port is None else port
    sock = bind_listener(host, port)  # a busy port fails now, not after every unit started
    try:
        backend = serve_runtime(spec, start_runtime, tiny=tiny, colocated=colocated, **runtime_options)
    except BaseException:
        sock.close()
        raise
    layout = "colocated" if colocated else "disaggregated"
    deployment = Deployment(backend, host, port, api_key, name=f"{spec.label} ({layout})", sock=sock,
                            allowed_hosts=spec.serve.allowed_hosts, metrics_require_key=spec.serve.metrics_require_key,
                            served_model_name=served_model_name or spec.serve.model_name,
                            allowed_origins=allowed_origins, limits=HttpLimits.from_spec(spec.serve),
                            access_log=spec.serve.access_log)
    if spec.serve.autoscale.enabled and not colocated:
        say = runtime_options.get("on_event") or runtime_options.get("on_progress") or print
        deployment.start_autoscaler(say)
    return deployment
