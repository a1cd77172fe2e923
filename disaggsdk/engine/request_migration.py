"""A decoding request's state apart from its KV: what moves with its pages to another engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.sequence import Request


class MigrationError(DisaggError):
    """A request cannot be moved (not decoding, unknown here) or a moved state cannot be admitted."""


class RunningRequestState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One decoding request, minus its KV, as it stands between two steps (`snapshot`).

    Attributes:
        num_computed_tokens: positions whose KV its pages hold: every token but the newest.
        generator_state: ``torch.Generator.get_state()`` bytes of a sampled request (None: greedy).
        draft_ids: speculative drafts its next step verifies (MTP drafts of the last step).
    """

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    params: SamplingParams
    num_computed_tokens: int
    generator_state: bytes | None = None
    draft_ids: list[int] = []
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def num_pages(self, page_size: int) -> int:
        """The pages that hold its computed KV (the last one may be partly filled)."""
        return -(-self.num_computed_tokens // page_size)


def snapshot(req: Request) -> RunningRequestState:
    """The state of ``req``, a running request between steps whose KV covers all but its newest token.

    Raises:
        MigrationError: it is still prefilling (or waiting, or finished).
    """
    from disaggsdk.engine.sequence import RequestStatus

    if req.status is not RequestStatus.RUNNING or not req.output_ids or req.num_computed_tokens != req.num_tokens - 1:
        raise MigrationError(f"request {req.request_id!r} is not decoding (status {req.status.value}, "
                             f"{req.num_computed_tokens} of {req.num_tokens} tokens computed): only a request with "
                             "its prompt's KV and at least one output token can move")
    gen_state = bytes(req.generator.get_state().numpy().tobytes()) if req.generator is not None else None
    return RunningRequestState(
        request_id=req.request_id, prompt_ids=list(req.prompt_ids), output_ids=list(req.output_ids),
        params=req.params, num_computed_tokens=req.num_computed_tokens, generator_state=gen_state,
        draft_ids=list(req.draft_ids), num_draft_tokens=req.num_draft_tokens,
        num_accepted_tokens=req.num_accepted_tokens, num_cached_tokens=req.num_cached_tokens,
        num_preemptions=req.num_preemptions)


def restore_generator(state: RunningRequestState) -> torch.Generator | None:
    """The generator of a sampled request, in the state it was moved in (None: greedy).

    Raises:
        MigrationError: the state's bytes are not a CPU generator's.
    """
    if state.generator_state is None:
        return None
    import torch

    gen = torch.Generator()
    try:
        gen.set_state(torch.frombuffer(bytearray(state.generator_state), dtype=torch.uint8))
    except RuntimeError as exc:
        raise MigrationError(f"request {state.request_id!r}: its sampler state does not load ({exc})") from None
    return gen
