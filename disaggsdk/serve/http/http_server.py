"""uvicorn in a background thread, so the caller's thread stays free for live views and signals.

Port 0 asks the OS for a free port; `url` reports the real one once the server listens. Slow or
silent connections are closed: a request's head has ``$.serve.header_timeout_s`` to arrive
(`serve.http.http_limits`), an idle kept-alive connection ``$.serve.idle_timeout_s``.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import uvicorn

from disaggsdk.errors import DisaggError
from disaggsdk.serve.http.http_limits import HeadDeadlineProtocol, HttpLimits

if TYPE_CHECKING:
    from starlette.types import ASGIApp

START_TIMEOUT_S = 30.0


class ServerStartError(DisaggError):
    """The HTTP server did not come up (port in use, bad host)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, bound now: a launch that cannot serve fails before
    any unit process starts, not after.

    Raises:
        ServerStartError: the address is in use or not this machine's.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc}; give an address of this machine") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                               f"pick another port, or 0 for any free one") from None
    return sock


class HttpServer:
    """An ASGI app served by uvicorn on its own thread and event loop.

    Args:
        app: the ASGI application.
        host: interface to bind (127.0.0.1 unless asked otherwise).
        port: TCP port; 0 picks a free one.
        sock: a socket already listening (`bind_listener`); ``host`` and ``port`` then only name it.
        limits: the connection timeouts (`serve.http.http_limits`); None: the spec's defaults.
    """

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0,
                 sock: socket.socket | None = None, limits: HttpLimits | None = None):
        limits = limits or HttpLimits.from_spec()
        # h11 named explicitly: uvicorn would take httptools when installed, and the head deadline is h11's
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=5,
                                # uvicorn hands it to loop.call_later: float seconds work, its stub says int
                                timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
                                # uvicorn answers 503 once connections (the new one included) reach its limit
                                limit_concurrency=limits.max_connections + 1,
                                http=HeadDeadlineProtocol.with_deadline(limits.header_timeout_s))
        self._server = uvicorn.Server(config)
        sockets = [sock] if sock is not None else None
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": sockets}, name="http-server",
                                        daemon=True)
        self.host = host
        self.port = port

    def start(self) -> HttpServer:
        """Start serving and wait until the socket listens.

        Raises:
            ServerStartError: it did not start within the timeout or exited at once.
        """
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"the HTTP server could not listen on {self.host}:{self.port} (in use?); "
                                       f"pick another port, or 0 for any free one")
            time.sleep(0.01)
        sockets = [s for server in self._server.servers for s in server.sockets]
        self.port = sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        """Stop accepting, finish or cancel open requests, join the thread. Idempotent."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=15)
