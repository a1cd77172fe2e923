"""A framed message channel over a stream socket: what a runtime and its units talk through.

Each frame is a header (payload bytes: u32, `PROTOCOL_VERSION`: u16, network order) and a msgpack
payload of one `launch.messages` struct. A stream socket rather than a multiprocessing Pipe: the
same frames cross a Unix socketpair here and a TCP connection between machines, and nothing is
ever unpickled. A frame of another version or over `MAX_FRAME_BYTES` is refused, never guessed at.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Sequence
from typing import Generic, TypeVar

import msgspec

from disaggsdk.launch.base import ChannelClosed, ChannelError
from disaggsdk.launch.messages import PROTOCOL_VERSION

HEADER = struct.Struct("!IH")
MAX_FRAME_BYTES = 1 << 30  # the largest message (UnitStats with every recent record) is far below
_READ_BYTES = 1 << 20
_ENCODER = msgspec.msgpack.Encoder()

Received = TypeVar("Received")  # what the other end may send: `messages.ToUnit` or `messages.FromUnit`


class FrameChannel(Generic[Received]):
    """Typed frames over ``sock``, decoded with ``decoder`` (a msgspec msgpack Decoder of a union).

    Args:
        sock: a connected stream socket; the channel owns it from now on.
        decoder: what the other end may send.
    """

    def __init__(self, sock: socket.socket, decoder: msgspec.msgpack.Decoder[Received]):
        sock.setblocking(True)
        self._sock = sock
        self._decoder = decoder
        self._buffer = bytearray()
        self._send_lock = threading.Lock()
        self._eof = False

    def fileno(self) -> int:
        """The socket's descriptor, for `selectors` (-1 once closed)."""
        return self._sock.fileno()

    def send(self, msg: msgspec.Struct) -> None:
        """Send one message.

        Raises:
            ChannelClosed: the other end is gone.
        """
        payload = _ENCODER.encode(msg)
        with self._send_lock:
            try:
                self._sock.sendall(HEADER.pack(len(payload), PROTOCOL_VERSION) + payload)
            except OSError as exc:
                raise ChannelClosed(f"the channel is closed ({exc})") from None

    def poll(self, timeout_s: float = 0.0, also: Sequence[int] = ()) -> bool:
        """Whether a whole frame can be received now, waiting up to ``timeout_s`` for one, or less
        if one of the descriptors ``also`` becomes readable first (then False, without a frame).

        Raises:
            ChannelClosed: the other end closed and every frame it sent has been received.
        """
        deadline = time.monotonic() + timeout_s
        while not self._has_frame():
            if self._eof:
                raise ChannelClosed("the other end closed the channel")
            remaining = deadline - time.monotonic()
            sock_fd = self._sock.fileno()
            try:
                readable, _, _ = select.select([sock_fd, *also], [], [], max(0.0, remaining))
            except (OSError, ValueError) as exc:  # closed under us
                raise ChannelClosed(f"the channel is closed ({exc})") from None
            if sock_fd in readable:
                self._read_some()
            elif readable:
                return self._has_frame()  # woken by another descriptor
            elif remaining <= 0:
                return False
        return True

    def recv(self, timeout_s: float | None = None) -> Received:
        """The next message, waiting up to ``timeout_s`` (None: until one arrives).

        Raises:
            ChannelClosed: the other end is gone; TimeoutError: nothing within ``timeout_s``;
            ChannelError: a frame of another protocol version, too large, or not a known message.
        """
        if not self.poll(3.0e7 if timeout_s is None else timeout_s):
            raise TimeoutError(f"no message within {timeout_s} s")
        size, _version = HEADER.unpack_from(self._buffer)
        payload = bytes(self._buffer[HEADER.size:HEADER.size + size])
        del self._buffer[:HEADER.size + size]
        try:
            return self._decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise ChannelError(f"a frame is not a message this side knows: {exc}") from None

    def close(self) -> None:
        """Close the socket. Idempotent."""
        try:
            self._sock.close()
        except OSError:
            pass

    def _has_frame(self) -> bool:
        if len(self._buffer) < HEADER.size:
            return False
        size: int
        version: int
        size, version = HEADER.unpack_from(self._buffer)
        if version != PROTOCOL_VERSION:
            raise ChannelError(f"a frame of protocol version {version}; this side speaks {PROTOCOL_VERSION}: "
                               f"run the same disaggsdk version on both ends")
        if size > MAX_FRAME_BYTES:
            raise ChannelError(f"a frame of {size} bytes, over the {MAX_FRAME_BYTES}-byte limit")
        return len(self._buffer) >= HEADER.size + size

    def _read_some(self) -> None:
        try:
            data = self._sock.recv(_READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._buffer += data
        else:
            self._eof = True
