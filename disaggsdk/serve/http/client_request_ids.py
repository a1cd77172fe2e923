"""Client-chosen request ids (``X-Request-Id``): a name for the answer, never the key of the request.

A client's id names the response (``"id": "cmpl-<X-Request-Id>"``) and comes back in the
``X-Request-Id`` header, as vLLM does with it, so a client can find its request in our answers and
logs. The backend, the router and every abort key a request by an id the server makes
(`internal_request_id`): were the client's id the key, a second client sending the same id would
collide with the first request in the backend, and the refused newcomer's clean-up would abort the
request already running (it stopped with ``finish_reason: "abort"``).
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable

from disaggsdk.serve.http.error_bodies import BadRequestError

MAX_CLIENT_ID_CHARS = 128
RESPONSE_ID_PREFIXES = ("cmpl", "chatcmpl")  # a response's id: "<prefix>-<its X-Request-Id>"


def client_request_id(header: str | None) -> str | None:
    """The client's ``X-Request-Id`` when it is a usable id (up to 128 of ``[A-Za-z0-9._:-]``), else None
    (the server then names the request with its own id, and echoes that)."""
    if header and len(header) <= MAX_CLIENT_ID_CHARS and all(c.isascii() and (c.isalnum() or c in "._:-")
                                                             for c in header):
        return header
    return None


def response_id_of(chat: bool, echoed_id: str) -> str:
    """The ``id`` of an answer whose ``X-Request-Id`` is ``echoed_id`` (the client's, or the server's own)."""
    return f"{RESPONSE_ID_PREFIXES[chat]}-{echoed_id}"


def public_names(response_id: str) -> tuple[str, ...]:
    """What a client knows a request by: its response id and the X-Request-Id inside it (an id not
    made by `response_id_of`, e.g. a request's id in this process: itself alone)."""
    prefix, _, echoed = response_id.partition("-")
    return (response_id, echoed) if prefix in RESPONSE_ID_PREFIXES and echoed else (response_id,)


def internal_request_id(response_id: str) -> str:
    """The key a request has in the backend: the response id (greppable in the units' logs) with a
    fresh uuid after it, so no client can choose, guess or collide with it."""
    return f"{response_id}-{uuid.uuid4().hex}"


# a key `internal_request_id` made, with the choice index of an n > 1 run ("...-<k>") where it has one
_KEY_OF_A_RESPONSE_ID = re.compile(r"((?:cmpl|chatcmpl)-.+)-[0-9a-f]{32}((?:-[0-9]+)?)")


def public_request_id(key: str) -> str:
    """The response id a request's key was made from (`internal_request_id`), with the choice index of
    an ``n > 1`` run kept; a key the server made as the response id itself is returned as it is."""
    made = _KEY_OF_A_RESPONSE_ID.fullmatch(key)
    return made.group(1) + made.group(2) if made else key


class ClientRequestIds:
    """The client ids of the requests in flight at this front end (one event loop: no lock)."""

    def __init__(self) -> None:
        self._in_flight: set[str] = set()

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def claim(self, client_id: str | None) -> Callable[[], None]:
        """Hold ``client_id`` for a request about to start (None: the client gave none; nothing is held).

        Returns:
            what frees it once the request ended; idempotent, as several clean-up paths may call it.
        Raises:
            BadRequestError: 400, a request with this id is in flight (it goes on untouched).
        """
        if client_id is None:
            return lambda: None
        if client_id in self._in_flight:
            raise BadRequestError(f"a request with X-Request-Id {client_id!r} is in flight; send a fresh id, "
                                  f"or wait until that request ends", param="X-Request-Id")
        self._in_flight.add(client_id)
        return functools.partial(self._in_flight.discard, client_id)
