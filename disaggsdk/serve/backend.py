"""The contract between the HTTP front end and whatever runs the engines.

The OpenAI-compatible server, the benchmark and the live views talk to a `ServingBackend`; they
never know whether tokens come from one in-process colocated engine or from a disaggregated
deployment of many processes (`disaggsdk.launch`). Token streams are async iterators so one
asyncio loop can serve many requests at once.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import SamplingParams, TokenLogprobs
    from disaggsdk.launch.messages import UnitStats
    from disaggsdk.records.instance_stats import InstanceStats
    from disaggsdk.report.ttft_phases import PhaseSummary
    from disaggsdk.report.waterfall import TimelineSpan
    from disaggsdk.serve.moves.request_moves import DrainReport, MoveOutcome
    from disaggsdk.serve.routing.unit_routability import UnitRoutability
    from disaggsdk.spec import Spec


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request, in order; the last event of a request has ``finished``."""

    request_id: str
    new_token_ids: Sequence[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    new_logprobs: Sequence[TokenLogprobs] = ()
    error: str | None = None  # set with finish_reason "error": what went wrong, for the client
    instance: str = ""  # the decode (or mixed) instance that produced the tokens
    prefill_instance: str = ""  # on a request's first event: the prefill instance that computed its prompt, if any
    # with params.prompt_logprobs: the prompt's logprobs (entry 0 None), on the request's first event
    prompt_logprobs: Sequence[TokenLogprobs | None] | None = None
    # prompt tokens no engine computed for it (prefix caches; usage's ``cached_tokens``): fixed when the
    # engine admits the request, so every event of it carries the same number
    num_cached_tokens: int = 0
    # with an error before any unit took the request: no unit could (each down or drained), and one may
    # after this many seconds (the front end answers 503 with Retry-After); None: not that kind of error
    retry_after_s: float | None = None


class ServingBackend(Protocol):
    """What serves tokens: one colocated engine in process, or a whole local deployment."""

    model_name: str
    # whether TokenEvents carry ``new_logprobs`` on request; the server refuses logprobs requests
    # (400) to backends without them
    supports_logprobs: bool

    @property
    def max_model_len(self) -> int | None:
        """The model's context in tokens (prompt + output), checked at the HTTP edge; None: unknown."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as a prompt: the model's tokenizer, BOS first where the model has one.
        A server calls it on a worker thread; it may refuse a text that cannot fit `max_model_len`
        before tokenizing it (`serve.model_tokenizer.PromptTooLong`, a 400)."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids`` (special tokens left out unless ``skip_special_tokens`` is False)."""

    def generate(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams,
                 client: str = "", trace_context: Mapping[str, str] | None = None,
                 response_id: str = "") -> AsyncGenerator[TokenEvent, None]:
        """Stream the request's tokens. Errors arrive as a final event with ``finish_reason="error"``.
        An async generator: a caller that stops reading early ``aclose()``s it.

        ``client`` names who sent it (the HTTP edge gives the client's address; "" for a caller in
        this process): a backend whose units can die bounds what one client's requests may cost
        (`serve.routing.poison_requests`).

        ``trace_context``: the client's W3C trace-context headers (``traceparent``, ``tracestate``); a
        backend that traces its requests continues the client's trace (`serve.tracing.request_tracing`). The
        front end passes it only when the client sent one, so a backend that does not trace may
        leave the keyword out.

        ``response_id``: the id the client knows the request by (the answer's ``id``, shared by the
        choices of one answer); ``request_id`` is the request's key here, which never leaves the server
        (`serve.http.client_request_ids`). A backend that traces names the request's trace by it; "" for a
        caller in this process."""

    async def abort(self, request_id: str) -> None:
        """Stop a request (client gone); its pages are freed once no write can still land."""

    def stats(self, wait_s: float = 0.0) -> list[InstanceStats]:
        """One snapshot per instance; ``wait_s`` > 0: wait up to that long for fresh ones."""

    def reset_prefix_cache(self) -> dict[str, int]:
        """Every instance forgets the cached KV pages no request holds; free pages after, by instance."""

    def close(self) -> None:
        """Stop everything this backend started. Idempotent."""

    def units(self) -> LaunchedUnits | None:
        """The launched unit processes behind this backend, with what only they offer (routability,
        placement, compiles, TTFT phases, traces, moves and role changes); None: one engine in this
        process, which has none of these."""


class LaunchedUnits(Protocol):
    """What a backend over launched unit processes (`serve.routing.router.Router`) offers beyond
    `ServingBackend`, as `ServingBackend.units` gives it: the front end's /health and control routes,
    `Deployment`, `serve.moves.rebalance` and `serve.autoscale` read and drive the units through it."""

    spec: Spec
    # held by `serve.moves.rebalance` while it runs: one rebalance at a time
    rebalancing: threading.Lock

    @property
    def closed(self) -> bool:
        """Whether the backend was closed: no request is served any more."""

    def unit_roles(self) -> dict[str, str]:
        """Each unit's role ("prefill", "decode", "mixed"), by name."""

    def routability(self) -> UnitRoutability:
        """Which units routing may pick now, and why a role has none (`serve.routing.unit_routability`)."""

    def placement(self) -> dict[str, str]:
        """Unit name -> where it runs, when units run beyond this machine (Ray); else {}."""

    def compile_stages(self) -> dict[str, str | None]:
        """Each unit's step compile as it last said: None (none), "compiling", "compiled", "compile_failed"."""

    def wait_until_compiled(self, timeout_s: float) -> dict[str, str | None]:
        """Block until no unit still compiles its step (or ``timeout_s`` passed); each unit's stage."""

    def ttft_phases(self, since_s: float = 0.0) -> PhaseSummary:
        """Where the TTFT of requests received since ``since_s`` went (`report.ttft_phases`)."""

    def unrecoverable(self) -> str | None:
        """Why no request can be served again (units that cannot restart); None while they can."""

    def trace(self, request_id: str) -> list[TimelineSpan]:
        """The finished spans of a recent traced request (`serve.tracing.request_tracing`); [] when
        tracing is off or it is not held."""

    def unit_stats(self, timeout_s: float = 10.0) -> dict[str, UnitStats]:
        """A fresh snapshot from every healthy unit (blocks until they answer or ``timeout_s``)."""

    def num_in_flight(self, unit: str) -> int:
        """Requests ``unit`` holds now."""

    def num_waiting_past(self, age_s: float, since_s: float = 0.0) -> int:
        """Requests received at or after ``since_s`` still without a first token ``age_s`` seconds on."""

    def move(self, request_id: str, target: str) -> Future[MoveOutcome]:
        """Move a decoding request, with its KV, to decode unit ``target`` (`serve.moves.request_moves`)."""

    def drain(self, unit: str, timeout_s: float = 60.0) -> DrainReport:
        """Take decode unit ``unit`` out of routing and move the requests it decodes to the others."""

    def undrain(self, unit: str) -> None:
        """Let routing pick ``unit`` again after `drain`."""

    def switch_role(self, unit: str, role: str) -> Future[str]:
        """Ask ``unit`` to serve ``role`` (`launch.unit_process.role_switch`); the future resolves to "" or why not."""
