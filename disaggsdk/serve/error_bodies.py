"""Every error the front end answers, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Our own refusals raise `BadRequestError`; the framework's (an unknown route, a wrong method, a
body FastAPI could not validate) and crashes are turned into the same object here, so a client's
error handling never meets ``{"detail": ...}`` or a plain-text page. ``code`` is the HTTP status,
as vLLM sends it; ``type`` is OpenAI's word for the class of error.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from disaggsdk.serve.openai_error import BadRequestError

logger = logging.getLogger(__name__)


def error_kind(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status: ``server_error`` from 500 on, else ``invalid_request_error``
    (what OpenAI answers an unknown URL too); refusals with a finer type raise `BadRequestError` with it."""
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, param: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """The OpenAI error object for ``status`` (``kind`` overrides the type `error_kind` picks)."""
    return BadRequestError(message, param, status, kind or error_kind(status)).body()


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON response carrying `error_body` with that HTTP status (and ``headers``, e.g. ``Allow``)."""
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def add_error_handlers(app: FastAPI, routes_hint: str) -> None:
    """Answer every error of ``app`` with an OpenAI error object.

    Args:
        app: the application.
        routes_hint: what an unknown route's 404 suggests instead ("/v1/completions, ...").
    """

    @app.exception_handler(BadRequestError)
    async def _refused(_: Request, exc: BadRequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

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
        first = next(iter(exc.errors()), {})
        param = ".".join(str(key) for key in first.get("loc", ())[1:]) or None
        return error_response(400, f"{param or 'the request'}: {first.get('msg', 'invalid')}", param)

    @app.exception_handler(Exception)
    async def _crashed(request: Request, exc: Exception) -> JSONResponse:
        # the client learns that it failed, not how: a traceback can carry prompts, paths and keys.
        # starlette sends this answer and then re-raises, and uvicorn logs the traceback; this line
        # ties that traceback to the request it broke
        logger.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        return error_response(500, f"the server failed on this request ({type(exc).__name__}); "
                                   f"the details are in the server's log")


def unavailable_body(message: str) -> dict[str, Any]:
    """A 503's error object (for answers that carry more fields beside ``error``, as /health's)."""
    return error_body(503, message)
