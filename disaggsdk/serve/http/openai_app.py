"""The OpenAI-compatible HTTP front end (FastAPI) over any `ServingBackend`.

Endpoints: ``/v1/completions`` and ``/v1/chat/completions`` (SSE streaming with
``stream_options.include_usage``, or whole answers; ``n`` and batched prompts as several choices,
`serve.http.choices`), ``/v1/models``, ``/tokenize``, ``/detokenize``, ``/version``, ``/health``, ``/metrics``.
With an API key set, every route but the probes' (``/health``, ``/version``, and ``/metrics`` unless
``metrics_require_key``) wants ``Authorization: Bearer <key>``; the OpenAPI document (``/openapi.json``)
too, since it lists the operator routes; the HTML doc pages (``/docs``, ``/redoc``) are not served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from disaggsdk.engine.structured.output import StructuredOutput
from disaggsdk.serve.backend import ServingBackend
from disaggsdk.serve.http.access_log import AccessLog, note_runs
from disaggsdk.serve.http.chat_template import model_chat_template
from disaggsdk.serve.http.choices import Choices, expand_choices
from disaggsdk.serve.http.client_request_ids import ClientRequestIds, client_request_id, internal_request_id, response_id_of
from disaggsdk.serve.http.error_bodies import BadRequestError, add_error_handlers, error_kind, unavailable_body
from disaggsdk.serve.http.http_guard import LOOPBACK_HOSTS, CorsPolicy, HostGuard, api_key_given
from disaggsdk.serve.http.http_limits import HttpLimits
from disaggsdk.serve.http.openai_json import JsonObject, decode_body
from disaggsdk.serve.http.openai_request import ParsedRequest, check_context_length, parse_request, rest_of_context_by_default
from disaggsdk.serve.http.queued_requests import QueuedRequests
from disaggsdk.serve.http.request_run import RequestRun
from disaggsdk.serve.http.tokenize_routes import add_tokenize_routes, model_vocab_size
from disaggsdk.serve.http.unit_control_routes import add_unit_control_routes
from disaggsdk.serve.metrics import ServerMetrics
from disaggsdk.serve.routing.unit_routability import RETRY_AFTER_S

DEFAULT_MAX_BODY_BYTES = 8 * 2**20  # 8 MiB: ~1M prompt token ids as JSON, past any context window
Chunk = str | bytes | memoryview  # what a StreamingResponse's body iterator yields
TRACE_CONTEXT_HEADERS = ("traceparent", "tracestate")  # W3C trace context, handed to the backend as sent
ROUTES = ("/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, /version, /health, /traces/ID, "
          "/metrics and POST /reset_prefix_cache")


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The request body, read in chunks and refused as soon as it passes ``max_body_bytes``
    (uvicorn reads and drops the rest, so the client still gets the answer).

    Raises:
        BadRequestError: 415 when it is declared as something other than JSON, 413 when too large,
            499 when the client left while sending it.
    """
    declared = request.headers.get("content-type")
    media_type = (declared or "application/json").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise BadRequestError(f"Content-Type {declared!r} is not supported: send JSON with "
                              f"'Content-Type: application/json'", status=415)
    too_large = BadRequestError(f"the request body is larger than {max_body_bytes} bytes; send a shorter prompt",
                                status=413)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_body_bytes:
        raise too_large
    chunks, num_bytes = [], 0
    try:
        async for chunk in request.stream():
            num_bytes += len(chunk)
            if num_bytes > max_body_bytes:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadRequestError("the client went away while sending the body", status=499) from None
    return b"".join(chunks)


def build_app(backend: ServingBackend, metrics: ServerMetrics, api_key: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
              metrics_require_key: bool = False, served_model_name: str | None = None,
              allowed_origins: Sequence[str] = (), limits: HttpLimits | None = None,
              access_log: bool = False) -> FastAPI:
    """The FastAPI application serving ``backend``.

    Every error, the framework's included (unknown route, wrong method, a crash), answers an
    OpenAI error object ``{"error": {"message", "type", "param", "code"}}`` (`serve.http.error_bodies`).

    Args:
        backend: what produces tokens.
        metrics: where requests are accounted (its registry is what /metrics shows).
        api_key: when set, ``/v1`` routes require ``Authorization: Bearer <api_key>``.
        max_body_bytes: larger request bodies get a 413 before they are parsed.
        allowed_hosts: Host / Origin names answered (`serve.http.http_guard`); others get a 403.
        metrics_require_key: /metrics asks for the API key too.
        served_model_name: the name clients send and /v1/models lists (default: the backend's
            model, which the tokenizer, template and grammars still come from).
        allowed_origins: web origins whose pages may call the server (CORS, `serve.http.http_guard`; ``"*"``:
            any); none by default.
        limits: the bounds on clients (`serve.http.http_limits`; here the queue of requests without a
            first token); None: the spec's defaults.
        access_log: one line per finished request (`serve.http.access_log`).
    Returns:
        the app, ready for uvicorn.
    """
    guard = HostGuard(allowed_hosts)
    client_ids = ClientRequestIds()
    limits = limits or HttpLimits.from_spec()
    queued = QueuedRequests(limits.max_queued_requests)
    metrics.count_queued_with(lambda: queued.num_queued)

    async def body_of(request: Request) -> bytes:
        try:
            return await asyncio.wait_for(read_body(request, max_body_bytes), limits.body_timeout_s)
        except TimeoutError:
            raise BadRequestError(f"the request body did not arrive within {limits.body_timeout_s:g} s of its "
                                  f"headers (serve.body_timeout_s); send it whole", status=408) from None
    cors = CorsPolicy(allowed_origins)

    # dependencies, not HTTP middlewares: starlette's BaseHTTPMiddleware re-streams every SSE chunk
    async def check_host(request: Request) -> None:
        origin = request.headers.get("origin")  # an origin allowed for CORS is a welcome web page
        refusal = guard.refusal(request.headers.get("host"), None if cors.allows(origin) else origin)
        if refusal:
            raise BadRequestError(refusal, status=403, kind="permission_error")

    # the OpenAPI document is served below, behind the key: it lists the operator routes
    app = FastAPI(title="disaggsdk", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(check_host)])
    add_error_handlers(app, ROUTES)
    cors.install(app)
    model = served_model_name or backend.model_name
    chat_template = model_chat_template(backend.model_name)
    vocab_size = model_vocab_size(backend.model_name)  # None: the built-in one, and /v1/models says so

    async def check_key(request: Request) -> None:
        if api_key and not api_key_given(request.headers.get("authorization"), api_key):
            raise BadRequestError("invalid or missing API key: send 'Authorization: Bearer <key>'",
                                  status=401, kind="authentication_error")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(check_key)])
    def openapi_document() -> JSONResponse:
        # vLLM serves it to anyone; SGLang, like this, behind the key: it names every operator route
        return JSONResponse(app.openapi())

    @app.get("/health")
    def health() -> JSONResponse:
        # The status code says whether a request can be served now, as vLLM's and Dynamo's /health do
        # (200: ready; 503: not, so a readiness probe or a load balancer sends nothing here meanwhile):
        # some decode (or mixed) unit is up and routable. `status` says how whole the deployment is:
        # "ok"; "degraded": a unit is down, or a role has no routable unit (`reasons` says which and
        # why: a 503 when that role is decode; a lost prefill unit costs retries or local prefills, not
        # availability); "down": no decode or mixed unit is up at all
        stats = metrics.stats()
        alive = any(s.healthy for s in stats if s.role in ("decode", "mixed"))
        units = backend.units()
        if units is not None:
            routability = units.routability()
            reasons, can_serve = routability.reasons(), routability.can_serve()
        else:
            reasons, can_serve = [f"{s.name} is down" for s in stats if not s.healthy], alive
        status = "down" if not alive else "degraded" if reasons else "ok"
        body: JsonObject = {"status": status, "instances": {s.name: "up" if s.healthy else "down" for s in stats}}
        if reasons:
            body["reasons"] = list(reasons)
        # a router's units may run beyond this machine (Ray): where each runs; an in-process engine is here
        placement: dict[str, str] = units.placement() if units is not None else {}
        if placement:
            body["placement"] = placement
        # units compiling their step in the background serve meanwhile, slower: a benchmark waits for
        # "compiled" (or "compile_failed") everywhere first (engine.background_compile)
        stages = {name: stage for name, stage in (units.compile_stages() if units is not None else {}).items()
                  if stage is not None}
        if stages:
            body["compile"] = stages
        if can_serve:
            return JSONResponse(body)
        # an OpenAI error object too, beside what probes read
        body |= unavailable_body("no decode or mixed instance is up; 'instances' says which are down" if not alive
                                 else f"no request can be routed now: {'; '.join(reasons)}")
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.get("/metrics", dependencies=[Depends(check_key)] if metrics_require_key else [])
    def prometheus() -> Response:  # sync: a backend's stats() may block; FastAPI runs it in a thread
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache", dependencies=[Depends(check_key)])
    def reset_prefix_cache() -> JSONResponse:  # sync: the units answer in milliseconds; FastAPI threads it
        # vLLM's endpoint (there behind VLLM_SERVER_DEV_MODE): between benchmark runs, so that a run
        # does not start on the last one's cache
        free = backend.reset_prefix_cache()
        down = [s.name for s in metrics.stats() if s.healthy and s.name not in free]
        if down:
            raise BadRequestError(f"instances {down} did not answer; their caches may still hold pages: "
                                  "try again", status=503, kind=error_kind(503))
        return JSONResponse({"reset": True, "num_free_pages": free})

    @app.get("/traces/{request_id}", dependencies=[Depends(check_key)])
    def request_trace(request_id: str) -> JSONResponse:
        # where one request's time went (docs/tracing.md), for a client in another process than the
        # deployment's (`face.deployment.fetch_trace`); sync: it may wait on a lock for a unit's spans, on a worker thread.
        # Found by exactly the response id or X-Request-Id its client got, which proves the request its own
        # (`serve.tracing.request_tracing`): never by a prefix, a part of an id, or the request's internal key
        units = backend.units()
        spans = units.trace(request_id) if units is not None else []
        if not spans:
            raise BadRequestError(f"no trace is held for request {request_id!r}: tracing is off (serve.otlp_traces_endpoint, "
                                  "OTEL_TRACES_EXPORTER), or the request is unknown or older than the last traced ones",
                                  status=404)
        return JSONResponse({"request_id": request_id, "spans": [dataclasses.asdict(s) for s in spans]})

    @v1.get("/models")
    async def models() -> JsonObject:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "disaggsdk",
                                            "root": model, "max_model_len": backend.max_model_len,
                                            "chat_template": "checkpoint" if chat_template else "builtin"}]}

    def check_structured(output: StructuredOutput) -> None:
        # compiled here, before admission, so a bad schema is this client's 400, not a unit's error;
        # the decode engine compiles it again for its own matcher
        from disaggsdk.engine.structured.grammar import check_structured as compiles

        compiles(backend.model_name, output)

    async def serve(request: Request, chat: bool) -> Response:
        body = decode_body(await body_of(request))
        # on a worker thread: tokenizing a long prompt and building a request's grammar take
        # milliseconds to seconds, and /health and every other client share this event loop
        parsed = await asyncio.to_thread(parse_request, body, chat, backend.encode, check_structured, chat_template)
        reqs = [rest_of_context_by_default(r, backend.max_model_len) for r in expand_choices(parsed)]
        for r in reqs:
            check_context_length(r, backend.max_model_len)
        req = reqs[0]
        outside = [t for t, _ in req.params.logit_bias if vocab_size is not None and t >= vocab_size]
        if outside and vocab_size is not None:
            raise BadRequestError(f"'logit_bias': token {outside[0]} is not in this model's vocabulary "
                                  f"(0 .. {vocab_size - 1})", param="logit_bias")
        if req.logprobs is not None and not backend.supports_logprobs:
            name = "top_logprobs" if chat and req.logprobs else "logprobs"
            raise BadRequestError(f"'{name}': this deployment does not return logprobs; leave it out", param=name)
        if isinstance(body, dict) and body.get("model") not in (None, model):
            raise BadRequestError(f"model {body['model']!r} is not served here; use {model!r}", param="model",
                                  status=404, kind="model_not_found")
        client_id = client_request_id(request.headers.get("x-request-id"))
        echoed_id = client_id or uuid.uuid4().hex
        response_id = response_id_of(chat, echoed_id)
        # the backend's key is never the client's id: `serve.http.client_request_ids`
        key = response_id if client_id is None else internal_request_id(response_id)
        release = client_ids.claim(client_id)  # a duplicate is refused here, before the backend hears of it
        try:
            response = await answer(request, parsed, reqs, response_id, key)
        except BaseException:
            release()
            raise
        response.headers["X-Request-Id"] = echoed_id
        if isinstance(response, StreamingResponse):
            # freed when the stream ends, however it ends: the background task runs after a
            # disconnect too, the wrapper's finally when the stream fails
            response.body_iterator = released_after(response.body_iterator, release)
            response.background = BackgroundTask(release)
        else:
            release()
        return response

    async def answer(request: Request, parsed: ParsedRequest, reqs: list[ParsedRequest], response_id: str,
                     key: str) -> Response:
        leave = queued.enter()
        if leave is None:
            metrics.refused.labels(metrics.model_name, "queue_full").inc()
            return queued.full_response()
        run_ids = [key] if len(reqs) == 1 else [f"{key}-{k}" for k in range(len(reqs))]
        client = request.client.host if request.client else ""  # what poison_requests counts deaths by
        # W3C trace context: the backend continues the client's trace (serve.tracing.request_tracing), or
        # starts a new one where the header is not a valid traceparent
        trace_context = {h: v for h in TRACE_CONTEXT_HEADERS if (v := request.headers.get(h))}
        runs = [RequestRun(backend, metrics, rid, r, model, client, trace_context=trace_context,
                           response_id=response_id)
                for rid, r in zip(run_ids, reqs)]
        note_runs(request, runs)
        prompt_tokens = sum(len(p) for p in (parsed.prompt_ids, *parsed.more_prompts))
        choices = Choices(runs, response_id, prompt_tokens, n=parsed.n)
        try:
            firsts = await choices.start(request)
        finally:
            leave()  # its first tokens came (or it failed): it no longer queues
        if firsts is None:
            return Response(status_code=499)  # the client left before its first token; nobody reads this
        if reqs[0].stream:
            return StreamingResponse(choices.stream(firsts), media_type="text/event-stream")
        return await choices.whole(request, firsts)

    @v1.post("/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    app.include_router(v1)
    root = APIRouter(dependencies=[Depends(check_key)])  # vLLM serves these beside /v1, not in it
    add_tokenize_routes(app, root, backend, chat_template, body_of)
    app.include_router(root)
    add_unit_control_routes(app, backend, check_key, body_of)
    if access_log:  # outermost of the app's own middleware: it times and sees every answer, errors included
        app.add_middleware(AccessLog)
    return app


async def released_after(chunks: AsyncIterable[Chunk], release: Callable[[], None]) -> AsyncIterator[Chunk]:
    """``chunks``, then ``release()`` once they end, fail or are closed."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        release()
