"""Where the ranks of a process group meet: a loopback address with a port free now (torch-free,
so the launcher can choose one for a dp group's units without importing the engine's torch)."""

from __future__ import annotations

import socket


def free_loopback_address() -> str:
    """"127.0.0.1:port" with a port free at this moment; the group's first rank binds it moments
    later (a port taken in between fails that rank's start, which says so)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"
