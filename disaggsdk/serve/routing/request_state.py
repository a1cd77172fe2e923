"""Each request in flight at the router as one record, from `Router.submit` to its last event.

What the router knows of a request — where its events go, which unit holds it, its prompt until a
first token comes, whether it was moved off a lost unit, its fingerprint and client for
`poison_requests`, whether it is traced — lives in one `RequestState`, so ending a request is one
`RequestBook.pop`. The book also keeps which unit holds which requests, the index that routing's
loads, drains and a lost unit's requests read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.serve.backend import TokenEvent


@dataclass
class RequestState:
    """One request in flight at the router."""

    sink: Callable[[TokenEvent], None]  # gets its events (on the runtime's reader thread)
    fingerprint: bytes | None  # of its prompt and params (`poison_requests.fingerprint`)
    client: str  # who sent it ("": an in-process caller)
    traced: bool  # its root span records (`serve.tracing.request_tracing`)
    # prompt and params until its first token: what a move off a lost unit sends again; None after
    start: tuple[list[int], SamplingParams] | None
    unit: str | None = None  # the unit holding it (set through `RequestBook.place`); None between units
    resubmitted: bool = False  # moved once already off a dead, stalled or unreachable unit

    @property
    def started(self) -> bool:
        """Whether its first token came (it decodes now: its KV is on its unit)."""
        return self.start is None


class RequestBook:
    """The router's requests in flight by id, and which unit holds which (not thread-safe: the
    router holds its lock around every call)."""

    def __init__(self, units: list[str]):
        self._states: dict[str, RequestState] = {}
        self._held: dict[str, set[str]] = {name: set() for name in units}  # unit -> ids of the requests it holds

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def get(self, request_id: str) -> RequestState | None:
        """The request's state, or None when it is not in flight."""
        return self._states.get(request_id)

    def ids(self) -> list[str]:
        """The ids of the requests in flight, oldest first."""
        return list(self._states)

    def states(self) -> list[RequestState]:
        """The requests in flight, oldest first."""
        return list(self._states.values())

    def add(self, request_id: str, state: RequestState, unit: str) -> None:
        """Hold a new request in flight at ``unit``."""
        self._states[request_id] = state
        self.place(state, request_id, unit)

    def place(self, state: RequestState, request_id: str, unit: str | None) -> None:
        """Make ``unit`` the one holding the request (None: none, until one takes it)."""
        if state.unit is not None:
            self._held[state.unit].discard(request_id)
        state.unit = unit
        if unit is not None:
            self._held[unit].add(request_id)

    def pop(self, request_id: str) -> RequestState | None:
        """End a request here: it is no longer in flight, and no unit holds it. None: it was not."""
        state = self._states.pop(request_id, None)
        if state is not None and state.unit is not None:
            self._held[state.unit].discard(request_id)
        return state

    def pop_all(self) -> dict[str, RequestState]:
        """End every request here, oldest first."""
        states, self._states = self._states, {}
        for held in self._held.values():
            held.clear()
        return states

    def held_by(self, unit: str) -> list[str]:
        """The ids of the requests ``unit`` holds."""
        return list(self._held[unit])

    def num_held(self, unit: str) -> int:
        """How many requests ``unit`` holds."""
        return len(self._held[unit])
