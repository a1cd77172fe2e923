"""The messages between a runtime and its units: typed msgspec structs, versioned, never pickle.

Both directions are tagged unions, so a frame decodes to exactly one of the structs below and
msgspec checks every field's type (a frame from a unit on another machine is data, not code:
docs/lessons.md). `PROTOCOL_VERSION` travels in every frame header (`launch.channel`); change
it with any change of these structs that an older peer would misread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from disaggsdk.engine.sampling_params import SamplingParams, TokenLogprobs
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.records.request_transfer import RequestTransfer
from disaggsdk.records.span_records import RequestSpanRecords
from disaggsdk.records.unit_counters import UnitCounters

# 2: PeerUp; 3: TransportStuck; 4: phase times in RequestTransfer; 5: TokensBatch; 6: speculative counters;
# 7: prefix caching (cached tokens in Tokens, prefix cache and not-sent counters in UnitStats);
# 8: UnitStats carries the counters as one `UnitCounters` record (a new counter there needs no bump:
# msgspec skips fields it does not know and fills missing ones with their defaults);
# 9: Progress (start-up steps a launcher shows), Tokens.prefill_unit;
# 10: UnitArgs.cuda_visible_devices (a unit that ignored it would run on the wrong GPU), Fatal.cannot_run
# 11: UnitArgs.node_address (a unit that ignored it would listen on loopback, out of its peers' reach)
# 12: Heartbeat (a runtime that did not know it would read a unit's channel as garbage), UnitStats.open_grant_keys
# 13: Generate.traced, RequestSpans (a traced request's phases on a unit, `records.span_records`)
# 14: MoveRequest, RequestMovedIn, RequestMoveEnded (decoding requests moving between decode units),
#     SwitchRole, RoleChanged, RoleChangeFailed (a unit changing role live)
# 15: Progress "compile_failed" and its detail; "compiled" may come after Ready (units compile in
#     the background, engine.background_compile)
# 16: CancelMove (the router calls off a move whose target it judges unreachable)
PROTOCOL_VERSION = 16

# runtime -> unit


class UnitArgs(msgspec.Struct, frozen=True, tag=True):
    """What a unit needs to start: the first frame a unit receives."""

    name: str
    instance: str
    role: str  # "prefill" | "decode" | "mixed"
    spec_yaml: str
    secret: bytes
    provider: str
    log_path: str
    work_dir: str
    cpu_ids: tuple[int, ...] | None = None
    num_context_slots: int = 64
    parent_pid: int = 0  # the unit exits at once if its parent is not this process any more
    dp_rank: int = 0  # the unit's dp rank in its instance
    # "host:port" where the dp ranks of an expert-parallel instance meet (their lock-step group,
    # engine.dp_lockstep); None: the instance's dp ranks are independent engines
    group_address: str | None = None
    # `device: cuda` on the local backend: the unit's devices (`launch.cuda_devices`), set before its
    # first CUDA call; None: leave the environment's (Ray sets it for the GPUs it granted)
    cuda_visible_devices: str | None = None
    # the IP of the unit's node when its peers run on other hosts (the Ray launcher's, for tcp): its
    # KV endpoint listens on the interface holding it (`transfer.interfaces.tcp_domain`); None: every
    # peer is on this machine, so loopback
    node_address: str | None = None


class Peers(msgspec.Struct, frozen=True, tag=True):
    units: list[UnitInfo]


class Generate(msgspec.Struct, frozen=True, tag=True):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams  # a plain dataclass: msgspec encodes it and re-runs its checks on decode
    # the router traces it (`serve.tracing.request_tracing`): the units it reaches record its phases and send
    # them in a `RequestSpans`; False (tracing off, the default): nothing is recorded or sent
    traced: bool = False


class Abort(msgspec.Struct, frozen=True, tag=True):
    request_id: str


class PeerDown(msgspec.Struct, frozen=True, tag=True):
    name: str


class PeerUp(msgspec.Struct, frozen=True, tag=True):
    """A unit came back (restarted: same name, new incarnation and regions)."""

    info: UnitInfo


class GetStats(msgspec.Struct, frozen=True, tag=True):
    seq: int  # 0: a refresh nobody waits for
    with_recent: bool = False  # include the per-request records (large; the benchmark wants them)


class ResetPrefixCache(msgspec.Struct, frozen=True, tag=True):
    """Forget every cached page nobody holds; the unit answers with its `UnitStats` (``seq``) after."""

    seq: int


class Shutdown(msgspec.Struct, frozen=True, tag=True):
    pass


class MoveRequest(msgspec.Struct, frozen=True, tag=True):
    """Move a decoding request, with its KV, to decode unit ``target`` (`messenger.kv_migration`).
    The unit answers `RequestMoveEnded` (the target's `RequestMovedIn` comes first when it moved)."""

    request_id: str
    target: str


class CancelMove(msgspec.Struct, frozen=True, tag=True):
    """Call off moving ``request_id`` away (the router judged its target unreachable, ``reason``): the
    unit resumes it once no write of it is in flight and answers `RequestMoveEnded` (moved False). A
    move that ended already, or whose target admitted the request, is left as it is."""

    request_id: str
    reason: str


class SwitchRole(msgspec.Struct, frozen=True, tag=True):
    """Serve ``role`` ("prefill" or "decode") once nothing of the current role is in flight (`launch.unit_process.role_switch`).
    The unit answers `RoleChanged`, or `RoleChangeFailed`."""

    role: str


# unit -> runtime


class Ready(msgspec.Struct, frozen=True, tag=True):
    info: UnitInfo


class Started(msgspec.Struct, frozen=True, tag=True):
    name: str


ProgressStage = Literal["loading", "compiling", "compiled", "compile_failed"]


class Progress(msgspec.Struct, frozen=True, tag=True):
    """A start-up step of a unit, so that the launcher can show a cold start.

    ``stage``: "loading" its weights (``weight_bytes`` of them per rank), before its `Ready`;
    "compiling" its step (torch.compile, in the background while it serves eagerly: before or
    after `Ready`), then "compiled" (``elapsed_s`` after "compiling": it runs compiled from now
    on) or "compile_failed" (it stays eager; ``detail`` says why), usually after `Ready`.
    """

    name: str
    stage: ProgressStage
    model: str = ""
    weight_bytes: int = 0
    elapsed_s: float = 0.0
    detail: str = ""


class Logprob(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []


def wire_logprobs(lps: Sequence[TokenLogprobs | None]) -> list[Logprob | None]:
    """Engine `TokenLogprobs` (or None entries) as channel `Logprob`s."""
    return [None if lp is None else Logprob(lp.token_id, lp.logprob, list(lp.top)) for lp in lps]


def engine_logprobs(wire: Sequence[Logprob | None]) -> list[TokenLogprobs | None]:
    """Channel `Logprob`s (or None entries) as engine `TokenLogprobs`."""
    return [None if lp is None else TokenLogprobs(lp.token_id, lp.logprob, tuple((t, p) for t, p in lp.top))
            for lp in wire]


class Tokens(msgspec.Struct, frozen=True, tag=True):
    request_id: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[Logprob] = []
    prompt_logprobs: list[Logprob | None] | None = None  # when this unit computed the prompt and was asked
    num_cached_tokens: int = 0  # prompt tokens no unit computed (prefix caches): usage's cached_tokens
    prefill_unit: str = ""  # on a decode unit's first Tokens of a request: the prefill unit that computed its prompt


class PromptLogprobs(msgspec.Struct, frozen=True, tag=True):
    """A prefill unit's scores of a prompt it computed (entry 0 None): the router puts them in front
    of the tokens the decode unit streams for the same request."""

    request_id: str
    logprobs: list[Logprob | None]


class TokensBatch(msgspec.Struct, frozen=True, tag=True):
    """The `Tokens` of every request one engine step produced: one frame per step, not per request
    (a decode step of a batch of 8 sent 8 frames, ~6% of the decode unit's time)."""

    items: list[Tokens]


class UnitStats(msgspec.Struct, frozen=True, tag=True):
    """A unit's gauges now and its counters since start (`records.unit_counters.UnitCounters`, sent
    as the unit filled it: a counter added there travels without a change here)."""

    seq: int
    name: str
    role: str
    running: int
    waiting: int
    num_free_pages: int  # the same on every tp rank: one allocator serves all of them
    num_pages: int
    counters: UnitCounters
    recent: list[RequestTransfer]
    open_grant_keys: int = 0  # per-grant registrations open to remote KV writes (a gauge: 0 when idle)
    open_counters: int = 0  # immediate counters expecting writes here (a gauge: 0 when nothing is coming)


class RequestSpans(msgspec.Struct, frozen=True, tag=True):
    """A traced request's phases on one unit (``role``: its role), sent once the unit let go of it:
    a decode (or mixed) unit when it finished, a prefill unit when its writes completed."""

    unit: str
    role: str
    record: RequestSpanRecords


class Fatal(msgspec.Struct, frozen=True, tag=True):
    message: str
    # the unit cannot run on this machine (`base.UnitCannotRun`): ``message`` is the whole report, for
    # the user as it is; False: a failure whose log tail tells the rest
    cannot_run: bool = False


class TransportStuck(msgspec.Struct, frozen=True, tag=True):
    """The unit's transport thread is stuck inside the provider; the unit exits right after this.

    ``poisoned_peer`` ("name#incarnation") is the unit it was stuck sending to, whose queue can
    never be used again: the runtime replaces it too. None: stuck elsewhere (reading its own queue).
    """

    stuck_s: float
    poisoned_peer: str | None = None


class RoleChanged(msgspec.Struct, frozen=True, tag=True):
    """The unit serves ``info.role`` now (same incarnation, address and regions)."""

    info: UnitInfo


class RoleChangeFailed(msgspec.Struct, frozen=True, tag=True):
    """The unit cannot take ``role``; it goes on in its current one."""

    role: str
    reason: str


class RequestMovedIn(msgspec.Struct, frozen=True, tag=True):
    """A decoding request moved to this unit: its KV landed and it decodes here now. Sent before any
    of its tokens from here; ``num_output_tokens``: the tokens it had already (sent by its source)."""

    request_id: str
    source: str
    num_output_tokens: int
    num_bytes: int


class RequestMoveEnded(msgspec.Struct, frozen=True, tag=True):
    """A move this unit was asked for ended: ``moved`` (the target has it; this unit freed its
    pages and sends no more of its tokens) or not (``reason``; it goes on here unless aborted)."""

    request_id: str
    target: str
    moved: bool
    reason: str = ""


class Heartbeat(msgspec.Struct, frozen=True, tag=True):
    """Sent by a thread of the unit's own (`health.UnitHeartbeat`), whatever its loop is doing: the unit
    is reachable. It says nothing of progress: a unit in a 20 s step still sends it."""


ToUnit = (UnitArgs | Peers | Generate | Abort | PeerDown | PeerUp | GetStats | ResetPrefixCache | Shutdown
          | MoveRequest | CancelMove | SwitchRole)
FromUnit = (Ready | Started | Progress | Tokens | TokensBatch | PromptLogprobs | UnitStats | Fatal | TransportStuck
            | Heartbeat | RequestSpans | RequestMovedIn | RequestMoveEnded | RoleChanged | RoleChangeFailed)
TO_UNIT = msgspec.msgpack.Decoder(ToUnit)
FROM_UNIT = msgspec.msgpack.Decoder(FromUnit)
