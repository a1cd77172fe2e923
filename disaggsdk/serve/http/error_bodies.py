"""Every error the front end answers, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Our own refusals (body, fields, a backend's refusal) raise `BadRequestError`, rendered once; the
framework's (an unknown route, a wrong method, a body FastAPI could not validate) and crashes are
turned into the same object here, so a client's error handling never meets ``{"detail": ...}`` or
a plain-text page. ``code`` is the HTTP status, as vLLM sends it; ``type`` is OpenAI's word for the
class of error. FastAPI is imported where the handlers are built: the request checks that raise
`BadRequestError` run without the serve extra too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:  # fastapi is the serve extra's: request parsing raises BadRequestError without it
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

logger = logging.getLogger(__name__)

# an OpenAI error object: {"error": {"message": str, "type": str, "param": str | None, "code": int}}
ErrorBody = dict[str, dict[str, str | int | None]]


class BadRequestError(DisaggError):
    """A request the server refuses. ``param`` names the offending field (OpenAI's ``param``);
    ``headers`` go with the answer (``Retry-After`` on a 503)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error",
                 headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind
        self.headers = dict(headers or {})

    def body(self) -> ErrorBody:
        """The OpenAI-style JSON error body."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}


def error_kind(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status: ``server_error`` from 500 on, else ``invalid_request_error``
    (what OpenAI answers an unknown URL too); refusals with a finer type raise `BadRequestError` with it."""
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, param: str | None = None, kind: str | None = None) -> ErrorBody:
    """The OpenAI error object for ``status`` (``kind`` overrides the type `error_kind` picks)."""
    return BadRequestError(message, param, status, kind or error_kind(status)).body()


def error_response(status: int, message: str, param: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """A JSON response carrying `error_body` with that HTTP status (and ``headers``, e.g. ``Allow``)."""
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def add_error_handlers(app: FastAPI, routes_hint: str) -> None:
    """Answer every error of ``app`` with an OpenAI error object.

    Args:
        app: the application.
        routes_hint: what an unknown route's 404 suggests instead ("/v1/completions, ...").
    """
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(BadRequestError)
    async def _refused(_: Request, exc: BadRequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"no route {where}; this server has {routes_hint}"
        elif exc.status_code == 405:
            message = f"{where} is not allowed; use {(exc.headers or {}).get('Allow', 'another method')}"
        else:
            message = f"{where}: {exc.detail or HTTPStatus(exc.status_code).phrase}"
        return error_response(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # 400 as vLLM answers a bad body (FastAPI's default is 422 with a "detail" list)
        first: Mapping[str, object] = next(iter(exc.errors()), {})
        loc = first.get("loc", ())
        param = ".".join(str(key) for key in (loc if isinstance(loc, (tuple, list)) else ())[1:]) or None
        return error_response(400, f"{param or 'the request'}: {first.get('msg', 'invalid')}", param)

    @app.exception_handler(Exception)
    async def _crashed(request: Request, exc: Exception) -> JSONResponse:
        # the client learns that it failed, not how: a traceback can carry prompts, paths and keys.
        # starlette sends this answer and then re-raises, and uvicorn logs the traceback; this line
        # ties that traceback to the request it broke
        logger.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        return error_response(500, f"the server failed on this request ({type(exc).__name__}); "
                                   f"the details are in the server's log")


def unavailable_body(message: str) -> ErrorBody:
    """A 503's error object (for answers that carry more fields beside ``error``, as /health's)."""
    return error_body(503, message)
