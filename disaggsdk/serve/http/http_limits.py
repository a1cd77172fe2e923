"""The bounds the HTTP edge holds every client to, read once from ``spec.serve``, and the one
uvicorn does not hold by itself: a deadline on each request's head.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from disaggsdk.serve.http.error_bodies import error_body

if TYPE_CHECKING:
    from disaggsdk.spec.serving import Serve


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold of the front end (see each ``serve.*`` key in docs/spec.md).

    Attributes:
        header_timeout_s: a request's line and headers must arrive within this (`HeadDeadlineProtocol`).
        idle_timeout_s: a kept-alive connection with no request in it is closed after this.
        body_timeout_s: a request's body must arrive within this once its headers did (408 past it).
        max_connections: connections (and their requests) held at once; past it, 503.
        max_queued_requests: requests handed to the engines and still without a first token; past
            it, 503 with ``Retry-After`` (`serve.http.queued_requests`).
    """

    header_timeout_s: float
    idle_timeout_s: float
    max_queued_requests: int
    body_timeout_s: float = 30.0
    max_connections: int = 4096

    @classmethod
    def from_spec(cls, serve: Serve | None = None) -> HttpLimits:
        """The limits ``serve`` sets (None: the spec's defaults, for a server without a spec)."""
        from disaggsdk.spec.serving import Serve

        serve = serve or Serve()
        return cls(serve.header_timeout_s, serve.idle_timeout_s, serve.max_queued_requests, serve.body_timeout_s,
                   serve.max_connections)


# the head deadline

def timeout_answer(header_timeout_s: float) -> bytes:
    """The raw 408 response a timed-out connection gets before it is closed (written past h11, which
    has no request to answer yet)."""
    body = json.dumps(error_body(408, f"the request's headers did not arrive within {header_timeout_s:g} s; "
                                      f"send them at once (serve.header_timeout_s)")).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    return head + body


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request heads; `with_deadline` sets it per server
    (uvicorn builds the protocol from its class and the server config, with no room for our own)."""

    header_timeout_s: float = 10.0

    @classmethod
    def with_deadline(cls, header_timeout_s: float) -> type[HeadDeadlineProtocol]:
        """This protocol with ``header_timeout_s``, as a class for ``uvicorn.Config(http=...)``."""
        return type(cls.__name__, (cls,), {"header_timeout_s": header_timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            # part of a head (or a kept-alive connection's first byte, which ended its idle timer)
            self._arm_head_timer()
        else:  # a whole head came: the request is the app's now
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.write(timeout_answer(self.header_timeout_s))
            self.transport.close()
