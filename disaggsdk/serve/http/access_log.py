"""One line per finished HTTP request (``serve.http.access_log``, ``--access-log``; off by default).

uvicorn's access line plus what a disaggregated deployment adds: tokens in and out, time to first
token, and which prefill and decode instance served it::

    127.0.0.1:50312 "POST /v1/completions HTTP/1.1" 200 prompt_tokens=5 output_tokens=8 ttft_ms=91.2 \
        total_ms=306.3 prefill=prefill-0 decode=decode-1
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from disaggsdk.serve.http.request_run import RequestRun

LOGGER_NAME = "disaggsdk.access"
_STATE_KEY = "disaggsdk_access"  # where a request's runs wait for the line, in the ASGI scope's "state"


@dataclass
class ServedRuns:
    """The generation runs one HTTP request made (several with ``n`` > 1); the app adds them."""

    runs: list[RequestRun] = field(default_factory=list)


def access_logger() -> logging.Logger:
    """The ``disaggsdk.access`` logger at INFO, with a stdout handler unless it has a handler already
    (then it is the user's to format and route)."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # its own line, not again through the ``disaggsdk`` logger's stderr handler
    return logger


def note_runs(request: Request, runs: list[RequestRun]) -> None:
    """Tell the access log (when on) which runs ``request`` made; nothing when it is off."""
    served = request.scope.get("state", {}).get(_STATE_KEY)
    if isinstance(served, ServedRuns):
        served.runs.extend(runs)


def access_line(client: str, method: str, path: str, http_version: str, status: int, total_ms: float,
                runs: list[RequestRun]) -> str:
    """The access line of one request (see the module doc); the token fields only when it generated.

    Args:
        client: "host:port" of the client ("-" when unknown).
        status: the response's status (0: none was sent).
        total_ms: from the request's arrival to the end of its response.
        runs: its generation runs (none for /v1/models, /health...).
    """
    line = f'{client} "{method} {path} HTTP/{http_version}" {status}'
    if runs:
        ttfts = [r.timeline.ttft_ms for r in runs if r.timeline.token_times_s]
        prefills = sorted({r.prefill_instance for r in runs if r.prefill_instance})
        decodes = sorted({r.instance for r in runs if r.instance})
        ttft = f"{min(ttfts):.1f}" if ttfts else "-"  # "-": no token came (an error, an abort)
        line += (f" prompt_tokens={runs[0].timeline.prompt_tokens}"
                 f" output_tokens={sum(r.timeline.output_tokens for r in runs)} ttft_ms={ttft} total_ms={total_ms:.1f}"
                 f" prefill={','.join(prefills) or '-'} decode={','.join(decodes) or '-'}")
    else:
        line += f" total_ms={total_ms:.1f}"
    return line


class AccessLog:
    """ASGI middleware writing `access_line` for every HTTP request once its response ended.

    Args:
        app: the application.
        logger: where lines go (default: `access_logger`).
    """

    def __init__(self, app: ASGIApp, logger: logging.Logger | None = None):
        self.app = app
        self.logger = logger or access_logger()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start_s = time.monotonic()
        served = ServedRuns()
        scope.setdefault("state", {})[_STATE_KEY] = served
        status = 0

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except BaseException:
            status = status or 500  # what the server answers for an exception nothing handled
            raise
        finally:
            host_port = scope.get("client")
            client = f"{host_port[0]}:{host_port[1]}" if host_port else "-"
            self.logger.info(access_line(client, scope["method"], scope["path"], scope.get("http_version", "1.1"),
                                         status, (time.monotonic() - start_s) * 1e3, served.runs))
