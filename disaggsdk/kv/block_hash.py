"""Chained hashes of full KV pages: the keys of the prefix cache, and of cache-aware routing.

As vLLM's prefix caching: page ``i``'s hash covers its tokens and, through its parent's hash, every
token before them, so two prompts share page ``i``'s hash exactly when they share their first
``(i + 1) * page_size`` tokens. Only full pages get a hash (a partly filled page may still grow).
blake2b of 16 bytes, not Python's ``hash``: the router, the prefill units and the decode units
compute them in different processes and must agree, and a collision would hand a request another
prompt's KV.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

HASH_BYTES = 16
ROOT_HASH = b"\x00" * HASH_BYTES  # the parent of page 0


def page_hashes(token_ids: Sequence[int], page_size: int, max_pages: int | None = None,
                salt: bytes = b"", lookahead: int = 0) -> list[bytes]:
    """The chained hash of each full page of ``token_ids``.

    Args:
        token_ids: the tokens, in order.
        page_size: tokens per page.
        max_pages: hash at most this many pages (None: every full page).
        salt: mixed into page 0's hash; requests with different salts never share pages (a cache
            keyed by more than tokens, such as a different adapter).
        lookahead: tokens after each page its hash also covers: a page's KV that depends on the
            token after it (DeepSeek's MTP layer reads position i with token i + 1) is shared only
            by prompts that agree on that token too.
    Returns:
        ``(len(token_ids) - lookahead) // page_size`` hashes (at most ``max_pages``), each
        ``HASH_BYTES`` long.
    Raises:
        ValueError: ``page_size`` below 1.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    n = max(0, len(token_ids) - lookahead) // page_size
    if max_pages is not None:
        n = min(n, max(0, max_pages))
    out: list[bytes] = []
    extend_page_hashes(out, token_ids, page_size, n, salt, lookahead)
    return out


def extend_page_hashes(hashes: list[bytes], token_ids: Sequence[int], page_size: int, num_pages: int,
                       salt: bytes = b"", lookahead: int = 0) -> None:
    """Append to ``hashes`` (the chained hashes of ``token_ids``' first pages) until it holds
    ``num_pages`` of them, or every full page's (with ``lookahead`` tokens after it): a request's
    hashes grow with its computed tokens without hashing its earlier pages again."""
    num_pages = min(num_pages, max(0, len(token_ids) - lookahead) // page_size)
    while len(hashes) < num_pages:
        i = len(hashes)
        parent = hashes[-1] if hashes else (hashlib.blake2b(salt, digest_size=HASH_BYTES).digest() if salt else ROOT_HASH)
        # token ids as little-endian int64: any vocabulary, and the same bytes on every machine
        tokens = array("q", token_ids[i * page_size : (i + 1) * page_size + lookahead])
        if sys.byteorder == "big":  # pragma: no cover - no big-endian host here
            tokens.byteswap()
        hashes.append(hashlib.blake2b(parent + tokens.tobytes(), digest_size=HASH_BYTES).digest())


def cacheable_tokens(num_tokens: int, page_size: int) -> int:
    """The most tokens of a prompt of ``num_tokens`` a cache hit may cover: whole pages, leaving at
    least one token to compute (the step that computes it gives the logits the next token needs)."""
    if num_tokens < 1:
        return 0
    return ((num_tokens - 1) // page_size) * page_size
