"""n-gram drafting (prompt lookup): propose what followed the sequence's suffix the last time it occurred.

Code and chat repeat themselves (identifiers, boilerplate, quoted context), so the tokens that
followed the latest earlier occurrence of the last n tokens are often what comes next. Longest n
first; no match, no drafts (the step is a plain decode step).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def propose_ngram(tokens: Sequence[int], num_drafts: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_drafts`` draft tokens for the sequence ``tokens`` (prompt + output so far).

    For n from ``max_n`` down to ``min_n``: find the latest earlier occurrence of the last n
    tokens (one that is not the suffix itself) and return the tokens after it.
    """
    length = len(tokens)
    if num_drafts < 1 or length < min_n + 1:
        return []
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(seq[: length - 1], n)  # starts 0 .. length-1-n
        hits = np.flatnonzero((windows == seq[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start : start + num_drafts].tolist()
    return []
