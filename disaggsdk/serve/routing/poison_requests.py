"""Requests that take units down with them: remembered by fingerprint, so that one cannot keep
spending the deployment's restarts.

A request that was waiting for its first token on a unit that died may have killed it (one that
has streamed tokens got through admission; its unit's death is most likely not its doing). The
router moves such a request once; when units die holding the same request (the same prompt and
sampling parameters, whatever its id) `MAX_UNIT_DEATHS` times, the request is poison: it ends with
an error, is never sent again, and an identical request is refused before it reaches a unit.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch.base import LaunchError

MAX_UNIT_DEATHS = 2  # a first death may be bad luck; a second, with the same request waiting, is not
MAX_POISON_PER_CLIENT = 2  # poison requests of one client before its requests are refused
MEMORY_S = 3600.0  # how long a fingerprint's deaths are remembered
CAPACITY = 4096  # fingerprints remembered at most (the oldest go first)
_ENCODER = msgspec.msgpack.Encoder()


def fingerprint(prompt_ids: Sequence[int], params: SamplingParams | None) -> bytes | None:
    """What makes two requests the same to a unit: their prompt and sampling parameters (not their
    ids). None when they cannot be encoded (the send refuses such a request anyway)."""
    try:
        return hashlib.blake2b(_ENCODER.encode([list(prompt_ids), params]), digest_size=16).digest()
    except (OverflowError, TypeError, msgspec.EncodeError):
        return None


class RecentCounts:
    """Counts per key that are forgotten ``memory_s`` after the key's last count, at most ``capacity``
    keys (the least recently counted go first). Not thread-safe."""

    def __init__(self, memory_s: float, capacity: int):
        self.memory_s, self.capacity = memory_s, capacity
        self._counts: OrderedDict[bytes | str, tuple[int, float]] = OrderedDict()  # -> (count, last count's time)

    def add(self, key: bytes | str, now_s: float | None = None) -> int:
        """Count ``key`` once more; returns its count."""
        now_s = time.monotonic() if now_s is None else now_s
        count = self.get(key, now_s) + 1
        self._counts[key] = (count, now_s)
        self._counts.move_to_end(key)
        while len(self._counts) > self.capacity:
            self._counts.popitem(last=False)
        return count

    def get(self, key: bytes | str, now_s: float | None = None) -> int:
        """``key``'s count, 0 once ``memory_s`` passed since its last."""
        if key not in self._counts:
            return 0
        count, at_s = self._counts[key]
        if (time.monotonic() if now_s is None else now_s) - at_s > self.memory_s:
            del self._counts[key]
            return 0
        return count


class PoisonRequests:
    """Unit deaths per request fingerprint and poison requests per client, each remembered for
    `MEMORY_S`, at most `CAPACITY` of each.

    Not thread-safe: the router calls it under its lock.
    """

    def __init__(self, max_unit_deaths: int = MAX_UNIT_DEATHS, memory_s: float = MEMORY_S,
                 capacity: int = CAPACITY, max_poison_per_client: int = MAX_POISON_PER_CLIENT):
        self.max_unit_deaths, self.memory_s = max_unit_deaths, memory_s
        self.max_poison_per_client = max_poison_per_client
        self._deaths = RecentCounts(memory_s, capacity)  # fingerprint -> units that died holding it
        self._poison_sent = RecentCounts(memory_s, capacity)  # client -> its requests that became poison

    def unit_died_holding(self, fp: bytes | None, now_s: float | None = None) -> int:
        """A unit died while a request of fingerprint ``fp`` waited on it for its first token.
        Returns how many units have died so holding that fingerprint (0 for None)."""
        return 0 if fp is None else self._deaths.add(fp, now_s)

    def deaths(self, fp: bytes | None, now_s: float | None = None) -> int:
        """How many units died holding ``fp`` within `memory_s` (0 for None)."""
        return 0 if fp is None else self._deaths.get(fp, now_s)

    def is_poison(self, fp: bytes | None, now_s: float | None = None) -> bool:
        """Whether requests of fingerprint ``fp`` must not reach a unit any more."""
        return self.deaths(fp, now_s) >= self.max_unit_deaths

    def sent_poison(self, client: str, now_s: float | None = None) -> int:
        """``client`` sent a request that became poison; returns how many it has sent (0 for no client)."""
        return self._poison_sent.add(client, now_s) if client else 0

    def poison_sent_by(self, client: str, now_s: float | None = None) -> int:
        """Poison requests ``client`` sent within `memory_s` (0 for no client)."""
        return self._poison_sent.get(client, now_s) if client else 0

    def client_refusal(self, client: str, now_s: float | None = None) -> str | None:
        """Why ``client``'s requests are refused (it sent `max_poison_per_client` poison requests), or None."""
        count = self.poison_sent_by(client, now_s)
        if count < self.max_poison_per_client:
            return None
        return (f"requests from {client} are refused: {count} of its requests took units down (each waited on "
                f"units that died), for {self.memory_s:g} s after the last one; report them with the units' logs")

    def refusal(self, deaths: int) -> str:
        """The error a poison request ends with, or an identical one is refused with."""
        units = "1 unit" if deaths == 1 else f"{deaths} units"
        return (f"this request was refused: {units} died while it waited on them for its first token, "
                f"so it is not sent to a unit again (for {self.memory_s:g} s); if it is valid, change it or "
                f"report it with the units' logs")


class RefusedRequestError(LaunchError):
    """A request refused before any unit sees it: units died holding an identical one (`PoisonRequests`)."""
