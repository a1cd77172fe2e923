"""The bounds the HTTP edge holds every client to, read once from ``spec.serve``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.spec.serving_types import Serve


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold of the front end (see each ``serve.*`` key in docs/spec.md).

    Attributes:
        header_timeout_s: a request's line and headers must arrive within this (`serve.head_deadline`).
        idle_timeout_s: a kept-alive connection with no request in it is closed after this.
        body_timeout_s: a request's body must arrive within this once its headers did (408 past it).
        max_connections: connections (and their requests) held at once; past it, 503.
        max_queued_requests: requests handed to the engines and still without a first token; past
            it, 503 with ``Retry-After`` (`serve.queued_requests`).
    """

    header_timeout_s: float
    idle_timeout_s: float
    max_queued_requests: int
    body_timeout_s: float = 30.0
    max_connections: int = 4096

    @classmethod
    def from_spec(cls, serve: Serve | None = None) -> HttpLimits:
        """The limits ``serve`` sets (None: the spec's defaults, for a server without a spec)."""
        from disaggsdk.spec.serving_types import Serve

        serve = serve or Serve()
        return cls(serve.header_timeout_s, serve.idle_timeout_s, serve.max_queued_requests, serve.body_timeout_s,
                   serve.max_connections)
