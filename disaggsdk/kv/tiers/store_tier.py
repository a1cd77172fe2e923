"""The store tier: page entries in a Redis or Valkey server that every instance of a deployment reads.

The server evicts least recently used entries itself (``maxmemory`` with ``allkeys-lru``, as
`launch.kv_store_server` starts it). An unreachable or failing server costs hits, never an exception
or a wait per page: a failed call counts an error and answers as a miss or a dropped write, and after
a connection failure the tier stops calling for a back-off (1 s, doubling to 10 s) before it tries again.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, cast

from disaggsdk.kv.tiers.base import TierConfigError, TierCounters

if TYPE_CHECKING:
    from redis import Redis

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` as (host, port); an IPv6 host in brackets (``"[::1]:6379"``).

    Raises:
        TierConfigError: not host:port with a port from 1 to 65535.
    """
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise TierConfigError(f"a store address is host:port (127.0.0.1:6379), got {address!r}")
    return host, int(port)


class StoreTier:
    """Entries in a Redis / Valkey server under ``namespace:key`` (a `base.KVTier`).

    Args:
        address: the server, ``"host:port"``.
        capacity_bytes: the server's ``maxmemory``, for the record: the server enforces it.
        namespace: the prefix of this deployment's keys; instances that share pages share it.
        timeout_s: the most one call waits to connect or for an answer.
    Raises:
        TierConfigError: a malformed address, an empty namespace, a timeout not above 0, or the
            ``redis`` client not installed (``pip install 'disaggsdk[serve]'``).
    """

    name = "store"

    def __init__(self, address: str, capacity_bytes: int, namespace: str, timeout_s: float = 0.5):
        host, port = split_address(address)
        if not namespace:
            raise TierConfigError("the store tier needs a namespace (the prefix of this deployment's keys)")
        if not timeout_s > 0:
            raise TierConfigError(f"the store tier's timeout_s must be > 0, got {timeout_s}")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise TierConfigError("the store tier needs the redis client: pip install 'disaggsdk[serve]'") from None
        self.address = address
        self.capacity_bytes = capacity_bytes
        self.namespace = namespace
        self.counters = TierCounters()
        self._errors = (redis.RedisError, OSError)
        self._unreachable = (redis.ConnectionError, redis.TimeoutError, OSError)
        # no retries inside the client: a dead server must cost one timeout, then the back-off
        self._client: Redis = redis.Redis(host=host, port=port, socket_timeout=timeout_s,
                                          socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))
        self._lock = threading.Lock()  # the engine thread reads while the stack's writer thread writes
        self._down_until = 0.0  # time.monotonic() before which no call is made
        self._backoff_s = FIRST_BACKOFF_S

    @property
    def used_bytes(self) -> int:
        """The server's ``used_memory`` (every namespace's entries and its own overhead); 0 when unreachable."""
        if not self._may_call():
            return 0
        try:
            info = self._client.info("memory")
        except self._errors as exc:
            self._failed(exc)
            return 0
        self._succeeded()
        return int(info.get("used_memory", 0))

    @property
    def reachable(self) -> bool:
        """False while the tier backs off after a failed connection."""
        with self._lock:
            return time.monotonic() >= self._down_until

    def contains(self, key: str) -> bool:
        """Whether the server holds ``key`` (one EXISTS); False when unreachable or backing off."""
        if not self._may_call():
            return False
        try:
            found = self._client.exists(self._name(key))
        except self._errors as exc:
            self._failed(exc)
            return False
        self._succeeded()
        return bool(found)

    def get(self, key: str) -> bytes | None:
        """The entry under ``key`` (the server refreshes its LRU clock), or None: absent, unreachable
        or backing off."""
        raw: bytes | None = None
        if self._may_call():
            try:
                raw = cast("bytes | None", self._client.get(self._name(key)))  # bytes: decode_responses is off
            except self._errors as exc:
                self._failed(exc)
            else:
                self._succeeded()
        with self._lock:
            return self.counters.count_get(raw)

    def put(self, key: str, raw: bytes) -> list[tuple[str, bytes]]:
        """Store ``raw`` under ``key`` (SET); dropped, and counted, when the server cannot take it.

        Returns:
            always ``[]``: the server evicts by itself, and the store is the last tier.
        """
        if not self._may_call():
            with self._lock:
                self.counters.dropped_writes += 1
            return []
        try:
            self._client.set(self._name(key), raw)
        except self._errors as exc:
            self._failed(exc)
            with self._lock:
                self.counters.dropped_writes += 1
            return []
        self._succeeded()
        with self._lock:
            self.counters.bytes_written += len(raw)
        return []

    def discard(self, key: str) -> None:
        """Delete ``key`` from the server (a corrupt entry), if reachable."""
        if not self._may_call():
            return
        try:
            self._client.delete(self._name(key))
        except self._errors as exc:
            self._failed(exc)
        else:
            self._succeeded()

    def close(self) -> None:
        """Close the client's connections; the entries stay in the server."""
        try:
            self._client.close()
        except self._errors:
            pass  # closing a dead connection: nothing left to release

    def _name(self, key: str) -> str:
        return f"{self.namespace}:{key}"

    def _may_call(self) -> bool:
        return self.reachable

    def _failed(self, exc: Exception) -> None:
        """Count a failed call; a connection failure (not an answer the server refused, such as
        out of memory) starts the back-off and doubles the next one."""
        with self._lock:
            self.counters.errors += 1
            if isinstance(exc, self._unreachable):
                self._down_until = time.monotonic() + self._backoff_s
                self._backoff_s = min(MAX_BACKOFF_S, 2 * self._backoff_s)

    def _succeeded(self) -> None:
        with self._lock:
            self._backoff_s = FIRST_BACKOFF_S
