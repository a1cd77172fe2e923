"""File descriptors between processes over a Unix socket (SCM_RIGHTS), with a small header.

Wire form: one sendmsg carrying one fd and a 24-byte header
(magic "DKFD", version, kind, device, size_bytes). Never pickle: the header is fixed binary.
"""

from __future__ import annotations

import os
import socket
import struct

from disaggsdk.kv.pools.base import SharedMemoryError
from disaggsdk.kv.pools.shared_memory import SharedRegion

_HEADER = struct.Struct("<4sHBxiQ")  # magic, version, kind, device, size_bytes
_MAGIC, _VERSION = b"DKFD", 1
KIND_MEMFD = 1  # host memory: SharedRegion
KIND_CUDA = 2  # a cuMem allocation exported as a POSIX fd


def send_fd(sock: socket.socket, fd: int, size_bytes: int, kind: int = KIND_MEMFD,
            device: int = -1) -> None:
    """Sends one fd with its size and kind; the sender keeps its own copy of the fd.

    Raises:
        SharedMemoryError: the socket is not a connected Unix socket or the peer went away.
    """
    header = _HEADER.pack(_MAGIC, _VERSION, kind, device, size_bytes)
    try:
        socket.send_fds(sock, [header], [fd])
    except OSError as exc:
        raise SharedMemoryError(f"cannot send an fd over the socket: {exc}; it must be a "
                                "connected AF_UNIX socket") from exc


def recv_fd(sock: socket.socket) -> tuple[int, int, int, int]:
    """Receives what `send_fd` sent.

    Returns:
        (fd, size_bytes, kind, device); the caller owns fd.

    Raises:
        SharedMemoryError: the peer closed the socket, or sent no fd or a bad header.
    """
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 1)
    except OSError as exc:
        raise SharedMemoryError(f"cannot receive an fd: {exc}") from exc
    if len(data) != _HEADER.size or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise SharedMemoryError(f"expected a {_HEADER.size}-byte header with one fd, got "
                                f"{len(data)} bytes and {len(fds)} fds: did the peer exit?")
    magic, version, kind, device, size = _HEADER.unpack(data)
    if magic != _MAGIC or version != _VERSION:
        os.close(fds[0])
        raise SharedMemoryError(f"not a version-{_VERSION} fd message (magic {magic!r}, "
                                f"version {version}): both ends must run the same disaggsdk")
    return fds[0], size, kind, device


def send_region(sock: socket.socket, region: SharedRegion) -> None:
    """Sends a host region so the peer can map the same pages (see `recv_region`)."""
    send_fd(sock, region.fd, region.size_bytes, KIND_MEMFD)


def recv_region(sock: socket.socket) -> SharedRegion:
    """Receives and maps a region sent with `send_region`.

    Raises:
        SharedMemoryError: the message is not a host region, or mapping fails.
    """
    fd, size, kind, _device = recv_fd(sock)
    if kind != KIND_MEMFD:
        os.close(fd)
        raise SharedMemoryError(f"expected a host-memory region, got kind {kind}: use "
                                "cuda_vmm.CudaSharedMapping for device memory")
    return SharedRegion.from_fd(fd, size)
