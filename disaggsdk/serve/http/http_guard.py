"""Who may talk to the front end: the Host names it answers to, and the web origins whose pages
may call it (CORS, vLLM's ``--allowed-origins``).

A server on 127.0.0.1 is still reachable from a browser: a web page can POST to it (a cross-site
request with a simple content type) or rebind its own DNS name to 127.0.0.1 and read the answers.
Both carry a Host or Origin the server does not call its own, so checking them (`HostGuard`:
loopback names unless configured) closes both doors (the media-type check in
`openai_app.read_body` refuses the ``text/plain`` such pages send).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from disaggsdk.serve.http.error_bodies import error_body

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"
ANY_ORIGIN = "*"
ALLOWED_METHODS = ("GET", "POST", "OPTIONS")
EXPOSED_HEADERS = ("X-Request-Id",)  # so a page's script can read the id of its request
PREFLIGHT_MAX_AGE_S = 600


def _hostname(host_header: str) -> str:
    """``host[:port]`` or ``[v6]:port`` -> the lower-case host name."""
    parsed = urlsplit(f"//{host_header.strip()}")
    return (parsed.hostname or "").lower()


class HostGuard:
    """The host names this server answers to (``"*"``: any).

    Args:
        allowed_hosts: names or addresses, without ports.
    """

    def __init__(self, allowed_hosts: Sequence[str] = LOOPBACK_HOSTS):
        self.allowed = {h.strip().strip("[]").lower() for h in allowed_hosts}

    def refusal(self, host: str | None, origin: str | None) -> str | None:
        """Why a request with these headers is refused, or None when it is welcome."""
        if ANY_HOST in self.allowed:
            return None
        name = _hostname(host or "")
        if name not in self.allowed:
            return (f"Host {host!r} is not a name this server answers to; add it to serve.allowed_hosts "
                    f"(now {sorted(self.allowed)})")
        if origin is not None:
            origin_name = "" if origin == "null" else (urlsplit(origin).hostname or "").lower()
            if origin_name not in self.allowed:
                return (f"requests from web pages at {origin!r} are refused; add its host to "
                        f"serve.allowed_hosts to allow them")
        return None


# the API key

def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization`` header under the Bearer scheme, written in any case (RFC 7235)
    and followed by one or more spaces (RFC 6750); None: no header, another scheme, or no token."""
    scheme, space, token = (authorization or "").partition(" ")
    if not space or not scheme.isascii() or scheme.lower() != "bearer":
        return None
    return token.lstrip(" ") or None


def api_key_given(authorization: str | None, api_key: str) -> bool:
    """Whether an ``Authorization`` header carries ``api_key`` as its bearer token (compared in constant time)."""
    token = bearer_token(authorization)
    return token is not None and hmac.compare_digest(token.encode(), api_key.encode())


# CORS

class _OpenAICorsMiddleware(CORSMiddleware):
    """Starlette's CORS middleware (pure ASGI: SSE chunks pass through unbuffered) whose refused
    preflight answers an OpenAI error object, not the plain text ``Disallowed CORS origin``."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        message = (f"CORS preflight refused: {bytes(response.body).decode(errors='replace')}; "
                   f"the server's allowed origins, methods and headers decide")
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        return JSONResponse(error_body(response.status_code, message), status_code=response.status_code,
                            headers=headers)


class CorsPolicy:
    """Which web origins may call the server.

    Args:
        allowed_origins: origins as browsers send them (``"https://ui.example.com"``), or ``"*"``;
            empty: CORS off.
    """

    def __init__(self, allowed_origins: Sequence[str] = ()):
        self.origins = tuple(o.strip().rstrip("/") for o in allowed_origins if o.strip())

    def allows(self, origin: str | None) -> bool:
        """Whether a request from a page at ``origin`` is welcome (False without an origin)."""
        if not origin or not self.origins:
            return False
        return ANY_ORIGIN in self.origins or origin.rstrip("/") in self.origins

    def install(self, app: FastAPI) -> None:
        """Add the CORS middleware to ``app`` when any origin is allowed; a no-op otherwise."""
        if self.origins:
            app.add_middleware(_OpenAICorsMiddleware, allow_origins=list(self.origins),
                               allow_methods=list(ALLOWED_METHODS), allow_headers=["*"],
                               expose_headers=list(EXPOSED_HEADERS), max_age=PREFLIGHT_MAX_AGE_S)
