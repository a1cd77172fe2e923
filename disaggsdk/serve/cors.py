"""Optional CORS: the web origins whose pages may call this server from a browser (vLLM's ``--allowed-origins``).

Off by default, unlike vLLM (which allows every origin): the front end refuses web pages'
requests (`serve.http_guard`) unless an origin is listed here. A listed origin passes that guard
and gets CORS headers, so a browser lets its page read the answers; ``"*"`` lists every origin.
The API key, when set, is still required: browsers send it as a plain ``Authorization`` header.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from disaggsdk.serve.error_bodies import error_body

ANY_ORIGIN = "*"
ALLOWED_METHODS = ("GET", "POST", "OPTIONS")
EXPOSED_HEADERS = ("X-Request-Id",)  # so a page's script can read the id of its request
PREFLIGHT_MAX_AGE_S = 600


class _OpenAICorsMiddleware(CORSMiddleware):
    """Starlette's CORS middleware (pure ASGI: SSE chunks pass through unbuffered) whose refused
    preflight answers an OpenAI error object, not the plain text ``Disallowed CORS origin``."""

    def preflight_response(self, request_headers) -> Response:
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
