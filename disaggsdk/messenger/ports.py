"""What the messenger needs of the engine, of the transport, and what a unit needs of a messenger.

The messenger is written against these protocols, not against `LLMEngine` and `TransferEngine`:
the engine knows no network, and tests drive both sides with small fakes
(tests/messenger). `disaggsdk.engine.llm_engine.LLMEngine` (whose ``kv``, a
`disaggsdk.engine.kv_port.KVPort`, holds the pages the messenger moves KV through) and
`disaggsdk.transfer.TransferEngine` satisfy them; nothing here imports either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from disaggsdk.messenger.freshness import FrameCodec
from disaggsdk.messenger.peers import FrameCounters, UnitInfo
from disaggsdk.messenger.stats import TransferTotals
from disaggsdk.records.span_records import RequestSpanRecords

if TYPE_CHECKING:
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.hooks import StepChunkInfo
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.layer_counter.base import AnyLayerCounter
    from disaggsdk.engine.request_migration import RunningRequestState
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.kv.page_allocator import PageGrant
    from disaggsdk.models.arch import ModelArch
    from disaggsdk.transfer.descriptors import MemoryRegion, Peer, WriteBatch


class Transport(Protocol):
    """The unit's transfer engine (`disaggsdk.transfer.TransferEngine`)."""

    def add_peer(self, address: bytes) -> Peer:
        """A handle for the endpoint at ``address``."""

    def send(self, peer: Peer, data: bytes) -> Future[None]:
        """Send one control frame."""

    def submit(self, peer: Peer, batch: WriteBatch) -> Future[None]:
        """Post a `WriteBatch` of one-sided writes; the future resolves when all completed locally."""

    def expect(self, imm: int, count: int) -> Future[None]:
        """A future that resolves once ``count`` writes carrying immediate ``imm`` arrived."""

    def cancel(self, imm: int) -> None:
        """Stop waiting for writes carrying ``imm``."""

    def register_pointer(self, address: int, length_bytes: int, *, cuda_device: int | None = None) -> MemoryRegion:
        """Open ``[address, + length_bytes)`` to peers' writes under a fresh key (a `MemoryRegion`);
        ``cuda_device``: the ordinal when it is device memory."""

    def deregister(self, region: MemoryRegion) -> None:
        """Close a registration: writes with its key land nowhere from now on."""


class PrefillPages(Protocol):
    """The prefill unit's engine's KV pages (`disaggsdk.engine.kv_port.KVPort`)."""

    @property
    def cache(self) -> KVCache:
        """Rank 0's KV cache: its ``fmt`` gives the pool geometry the writes read."""

    def pin_pages(self, request_id: str) -> None:
        """Keep the request's pages from eviction until their writes drained (`release`)."""

    def release(self, request_id: str) -> int:
        """Free a finished prefill's pages once its writes completed."""


class PrefillEngine(Protocol):
    """The prefill unit's engine: mode "prefill_only", hidden states returned."""

    arch: ModelArch  # hidden_size, vocab_size: the context payload's shape
    config: EngineConfig  # page_size
    on_step: Callable[[list[StepChunkInfo]], None] | None  # called before each forward pass with its chunks

    @property
    def layer_counter(self) -> AnyLayerCounter:
        """What the streamer waits on (on a GPU: host memory a CUDA graph writes)."""

    @property
    def kv(self) -> PrefillPages:
        """Its KV pages, as the messenger moves them."""

    def add_request(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> None:
        """Queue a prompt for prefill."""

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its pages."""


class DecodePages(Protocol):
    """The decode unit's engine's KV pages: grants, the prefix cache, admission of a request whose KV
    landed, and moving decoding requests between units (`disaggsdk.engine.kv_port.KVPort`)."""

    @property
    def cache(self) -> KVCache:
        """Rank 0's KV cache: its ``fmt`` sizes the bytes a cached page saves."""

    @property
    def num_free_pages(self) -> int:
        """Pages a grant can take now."""

    def allocate_pages(self, request_id: str, num_tokens: int, pinned: bool = True) -> PageGrant:
        """Grant pinned pages for ``num_tokens`` more tokens, after those the request holds: a prefill
        unit writes into them."""

    def holds_grant(self, grant: PageGrant) -> bool:
        """Whether every page of ``grant`` still belongs to it."""

    def rename_pages(self, request_id: str, owner: str) -> int:
        """Park the request's pages under ``owner`` (a quarantine) while late writes may land."""

    def release(self, request_id: str) -> int:
        """Free every page held under ``request_id`` (a request or a quarantine owner)."""

    def share_cached_prompt(self, request_id: str, prompt_ids: Sequence[int], count: bool = True) -> int:
        """Give the request the cached pages of its prompt's longest cached prefix; how many."""

    def cached_prompt_pages(self, prompt_ids: Sequence[int]) -> int:
        """How many pages of the prompt's longest cached prefix the cache holds, taking none."""

    def add_prefilled_request(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                              num_cached_tokens: int = 0) -> None:
        """Start decoding a request whose prompt KV is in its pages."""

    # moving decoding requests between decode units (`messenger.kv_migration`)

    def suspend(self, request_id: str) -> RunningRequestState:
        """Take a decoding request out of scheduling (pages pinned, unchanged); its state."""

    def resume(self, request_id: str) -> bool:
        """Put a suspended request back into scheduling."""

    def release_suspended(self, request_id: str) -> int:
        """Forget a suspended request that moved away and free its pages."""

    def page_ids(self, request_id: str) -> list[int]:
        """The pages a request holds, in token order."""

    def add_migrated_request(self, state: RunningRequestState) -> None:
        """Continue a moved request whose KV landed in the pages granted under its id."""


class DecodeEngine(Protocol):
    """The decode unit's engine: mode "mixed", so a request can also be prefilled locally."""

    arch: ModelArch
    config: EngineConfig

    @property
    def kv(self) -> DecodePages:
        """Its KV pages, as the messenger moves them."""

    def add_request(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> None:
        """Prefill and decode a request here (no prefill unit could, or its missing part is short)."""

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its pages."""


class Messenger(Protocol):
    """What a unit's loop asks of its messenger, on either side."""

    me: UnitInfo
    codec: FrameCodec  # seals its frames and opens its peers' (kept when the unit changes role)
    frames: FrameCounters  # control frames dropped, by reason
    totals: TransferTotals
    rejected: dict[str, int]  # requests refused, by `RejectReason` value
    failed: list[tuple[str, str]]  # (request_id, message) of requests to end with an error
    # the spans of traced requests this messenger is done with (`span_log`), for the unit to ship
    # (prefill) or to put in front of its own (decode); the unit empties it
    traced_spans: list[RequestSpanRecords]

    @property
    def busy(self) -> bool:
        """Whether work is in flight that the loop must poll for soon."""

    @property
    def num_waiting(self) -> int:
        """Requests held here that the engine does not know yet."""

    @property
    def open_grant_keys(self) -> int:
        """Per-grant registrations open to remote writes now (`grant_keys`; 0 on a prefill unit)."""

    def add_peers(self, units: Sequence[UnitInfo]) -> None:
        """Learn the other units of the deployment (the ones of the other role matter), at start or
        when one comes back with a new incarnation."""

    def on_frame(self, frame: bytes) -> None:
        """Handle one control frame; a bad one is counted and dropped."""

    def poll(self) -> None:
        """Advance: completions, deadlines, releases."""

    def peer_down(self, name: str) -> None:
        """A unit of the other role died."""

    def forget_prefixes(self) -> None:
        """The deployment's prefix caches were reset: forget which prefixes went where."""

    def close(self) -> None:
        """Stop threads; free what may be freed."""
