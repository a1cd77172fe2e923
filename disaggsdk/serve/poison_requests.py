"""Requests that take units down with them: remembered by fingerprint, so that one cannot keep
spending the deployment's restarts (issue 33).

A request that was waiting for its first token on a unit that died may have killed it (one that
has streamed tokens got through admission; its unit's death is most likely not its doing). The
router moves such a request once; when units die holding the same request (the same prompt and
sampling parameters, whatever its id) `MAX_UNIT_DEATHS` times, the request is poison: it ends with
an error, is never sent again, and an identical request is refused before it reaches a unit.

The cost: a request that happened to wait on the same two dying units as a poison one (it moved
with it) is taken for poison too; an identical resubmission of it is refused with a message that
says why, until `MEMORY_S` passes. Any change to it (prompt, seed, parameters) goes through.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch.tiny import LaunchError

MAX_UNIT_DEATHS = 2  # a first death may be bad luck; a second, with the same request waiting, is not
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


class PoisonRequests:
    """Unit deaths per request fingerprint, within `MEMORY_S`, at most `CAPACITY` of them.

    Not thread-safe: the router calls it under its lock.
    """

    def __init__(self, max_unit_deaths: int = MAX_UNIT_DEATHS, memory_s: float = MEMORY_S,
                 capacity: int = CAPACITY):
        self.max_unit_deaths, self.memory_s, self.capacity = max_unit_deaths, memory_s, capacity
        self._deaths: OrderedDict[bytes, tuple[int, float]] = OrderedDict()  # -> (deaths, last one's time)

    def unit_died_holding(self, fp: bytes | None, now_s: float | None = None) -> int:
        """A unit died while a request of fingerprint ``fp`` waited on it for its first token.
        Returns how many units have died so holding that fingerprint (0 for None)."""
        if fp is None:
            return 0
        now_s = time.monotonic() if now_s is None else now_s
        deaths = self.deaths(fp, now_s) + 1
        self._deaths[fp] = (deaths, now_s)
        self._deaths.move_to_end(fp)
        while len(self._deaths) > self.capacity:
            self._deaths.popitem(last=False)
        return deaths

    def deaths(self, fp: bytes | None, now_s: float | None = None) -> int:
        """How many units died holding ``fp`` within `memory_s` (0 for None)."""
        if fp is None or fp not in self._deaths:
            return 0
        deaths, at_s = self._deaths[fp]
        if (time.monotonic() if now_s is None else now_s) - at_s > self.memory_s:
            del self._deaths[fp]
            return 0
        return deaths

    def is_poison(self, fp: bytes | None, now_s: float | None = None) -> bool:
        """Whether requests of fingerprint ``fp`` must not reach a unit any more."""
        return self.deaths(fp, now_s) >= self.max_unit_deaths

    def refusal(self, deaths: int) -> str:
        """The error a poison request ends with, or an identical one is refused with."""
        return (f"this request was refused: {deaths} units died while it waited on them for its first token, "
                f"so it is not sent to a unit again (for {self.memory_s:g} s); if it is valid, change it or "
                f"report it with the units' logs")


class RefusedRequestError(LaunchError):
    """A request refused before any unit sees it: units died holding an identical one (`PoisonRequests`)."""
