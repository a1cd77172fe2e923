"""The keyed digest of one attempt's KV: what `$.transport.verify_pages` compares before a page is used.

Both sides compute it over the same bytes: every granted page of every layer of every decode rank,
and the context slot. Prefill feeds it the source bytes of each destination page as its layers are
submitted (several source ranks may fill one destination page: their slices go in destination
order), decode feeds it the pages it holds once the counter fired. A mismatch means bytes in the
pages are not the ones prefill sent (a forged or corrupted write): the attempt is retried and the
pages are never used or cached.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import threading
from collections.abc import Iterable, Mapping, Sequence

from disaggsdk.messenger.write_plan import PairWrites, PoolGeometry

DIGEST_BYTES = 16
CONTEXT_RANK = 0xFFFF  # the context slot's place: no decode rank has this index
_PLACE = struct.Struct("<HHI")  # rank, layer, page index in the grant: the first bytes a term covers


def attempt_key(secret: bytes, request_id: str, generation: int, imm: int) -> bytes:
    """The digest key of one attempt: a digest of another attempt never verifies this one."""
    label = b"disaggsdk page digest\0" + request_id.encode() + struct.pack("<QI", generation, imm)
    return hmac.new(secret, label, hashlib.sha256).digest()


class PageDigest:
    """The XOR of one keyed term per page (see the module docstring)."""

    def __init__(self, key: bytes):
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)  # each term copies it: no key setup a page
        self._value = 0
        self._lock = threading.Lock()  # prefill adds layers on its streamer thread, the context on its main one

    def add(self, rank: int, layer: int, index: int, chunks: Iterable[memoryview | bytes]) -> None:
        """Add the term of the page at (``rank``, ``layer``, ``index`` in the grant), whose bytes are
        the concatenation of ``chunks``."""
        h = self._keyed.copy()
        h.update(_PLACE.pack(rank, layer, index))
        for chunk in chunks:
            h.update(chunk)
        term = int.from_bytes(h.digest()[:DIGEST_BYTES], "little")
        with self._lock:
            self._value ^= term

    def add_context(self, payload: memoryview | bytes) -> None:
        """Add the term of the context slot's bytes."""
        self.add(CONTEXT_RANK, 0, 0, (payload,))

    def digest(self) -> bytes:
        """The digest of every term added so far."""
        return self._value.to_bytes(DIGEST_BYTES, "little")

    def matches(self, other: bytes) -> bool:
        """Whether ``other`` is this digest (compared in constant time)."""
        return hmac.compare_digest(self.digest(), other)


def add_layer(digest: PageDigest, layer: int, pairs: Sequence[PairWrites], src_pools: Sequence[memoryview],
              dst_geometry: PoolGeometry, grant_index: Mapping[int, int]) -> None:
    """Add the terms of one layer's destination pages from the writes that fill them (prefill side).

    Args:
        digest: the attempt's digest.
        layer: the layer the writes move.
        pairs: every write of that layer for the pages being sent, from every source rank.
        src_pools: each source tp rank's pool bytes.
        dst_geometry: a decode rank's pool.
        grant_index: decode page id -> its index in the grant (the order decode lists the pages in).
    Raises:
        KeyError: a write lands in a page that is not granted.
    """
    entries = sorted((w.dst_tp_rank, d, w.src_tp_rank, s, n)
                     for w in pairs for s, d, n in zip(w.src_offsets, w.dst_offsets, w.lengths))
    layer_base, page_bytes = dst_geometry.page_offset(layer, 0), dst_geometry.page_bytes
    place: tuple[int, int] | None = None  # (decode rank, page id) of the term being fed
    chunks: list[memoryview] = []
    for rank, d, src_rank, s, n in entries:
        while n > 0:  # an entry may cover several destination pages (whole-page routes)
            page = (d - layer_base) // page_bytes
            take = min(n, layer_base + (page + 1) * page_bytes - d)
            if place != (rank, page):
                if place is not None:
                    digest.add(place[0], layer, grant_index[place[1]], chunks)
                place, chunks = (rank, page), []
            chunks.append(src_pools[src_rank][s : s + take])
            d, s, n = d + take, s + take, n - take
    if place is not None:
        digest.add(place[0], layer, grant_index[place[1]], chunks)


def add_granted_pages(digest: PageDigest, pools: Sequence[memoryview], geometry: PoolGeometry,
                      page_ids: Sequence[int]) -> None:
    """Add the terms of every granted page of every layer of every rank, as a decode unit holds them."""
    for rank, pool in enumerate(pools):
        for layer in range(geometry.num_layers):
            for index, page in enumerate(page_ids):
                start = geometry.page_offset(layer, page)
                digest.add(rank, layer, index, (pool[start : start + geometry.page_bytes],))
