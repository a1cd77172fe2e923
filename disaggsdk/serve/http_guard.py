"""Which Host and Origin headers the front end answers: loopback names unless configured.

A server on 127.0.0.1 is still reachable from a browser: a web page can POST to it (a cross-site
request with a simple content type) or rebind its own DNS name to 127.0.0.1 and read the answers.
Both carry a Host or Origin the server does not call its own, so checking them closes both doors
(the media-type check in `openai_app.read_body` refuses the ``text/plain`` such pages send).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"


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
