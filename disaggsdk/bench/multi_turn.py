"""Multi-turn chat conversations for `disaggsdk bench`: the workload a prefix cache is for."""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disaggsdk.bench.dataset import (
    RANDOM_TOKEN_ID_LIMIT,
    SHAREGPT_MAX_PROMPT_TOKENS,
    SHAREGPT_MAX_TOTAL_TOKENS,
    SHAREGPT_MIN_TOKENS,
    BenchRequest,
    DatasetError,
    read_sharegpt,
)

# ShareGPT messages are joined into one prompt with a blank line between them: it reads as a
# transcript, and turn k+1's text starts with turn k's text exactly
MESSAGE_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class MultiTurnShape:
    """What each synthetic conversation looks like, in tokens.

    Raises:
        DatasetError: ``turns``, ``user_len`` or ``output_len`` below 1, or a negative ``system_len``.
    """

    turns: int = 4  # requests per conversation (at most, for a ShareGPT file)
    system_len: int = 512  # the system prompt every conversation starts with; 0: none
    user_len: int = 64  # each user message
    output_len: int = 64  # each request's max_tokens, and each synthetic reply put into the history

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise DatasetError(f"--multi-turn-turns must be >= 1, got {self.turns}")
        if self.system_len < 0:
            raise DatasetError(f"--multi-turn-system-len must be >= 0 (0: no system prompt), got {self.system_len}")
        if self.user_len < 1 or self.output_len < 1:
            raise DatasetError(f"--input-len (the user message, {self.user_len}) and --output-len "
                               f"({self.output_len}) must be >= 1 for --dataset-name multi-turn")


@dataclass(frozen=True)
class PrefixReuse:
    """How much of each prompt an earlier prompt of the workload already held."""

    shared: tuple[int, ...]  # per request: the longest prefix it shares with any earlier prompt
    prompt_lens: tuple[int, ...]  # per request, in the same unit
    unit: str  # "tokens" (token-id prompts) or "characters" (text: the server's tokens are unknown here)

    @property
    def ratio(self) -> float:
        """``sum(shared) / sum(prompt_lens)``; 0.0 for an empty workload."""
        total = sum(self.prompt_lens)
        return sum(self.shared) / total if total else 0.0


def prefix_reuse(prompts: Sequence[str | list[int]]) -> PrefixReuse:
    """For each prompt, in send order, the longest prefix it shares with any earlier prompt.

    It is what a prefix cache that kept every earlier prompt would serve; a real one serves less
    (it matches whole pages, evicts, and may not keep replies). The total does not depend on the
    order: it is the prompts' total length less the node count of the trie holding them all, so
    however a run interleaves conversations only the split between requests changes.

    Args:
        prompts: all token-id lists or all texts (compared by character).
    Returns:
        the per-request counts and the ratio.
    """
    earlier: list[Any] = []  # sorted: the longest prefix shared with any of them is shared with a neighbour
    shared = []
    for prompt in prompts:
        i = bisect_left(earlier, prompt)
        shared.append(max((_common_prefix_len(prompt, earlier[j]) for j in (i - 1, i) if 0 <= j < len(earlier)),
                          default=0))
        earlier.insert(i, prompt)
    unit = "characters" if prompts and isinstance(prompts[0], str) else "tokens"
    return PrefixReuse(tuple(shared), tuple(len(p) for p in prompts), unit)


def _common_prefix_len(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class MultiTurnWorkload:
    """Conversations to send: each a tuple of turns, turn k+1 sent once turn k's response ended.

    The send order this workload reports reuse in is conversation by conversation, turns in order;
    the run interleaves conversations, which leaves the ratio unchanged (`prefix_reuse`).
    """

    conversations: tuple[tuple[BenchRequest, ...], ...]
    turns: int  # turns per conversation (at most, for a ShareGPT file)
    system_len: int | None = None  # synthetic only: the shared system prompt's tokens
    user_len: int | None = None  # synthetic only: each user message's tokens

    @property
    def requests(self) -> list[BenchRequest]:
        """Every request, conversation by conversation, turns in order."""
        return [req for conversation in self.conversations for req in conversation]

    def describe(self) -> dict[str, Any]:
        """The ``multi_turn`` block of a result: ``conversations``, ``turns``, ``system_len``,
        ``user_len`` (None for a file), ``prefix_reuse_ratio`` and its ``prefix_reuse_unit``."""
        reuse = prefix_reuse([req.prompt for req in self.requests])
        return {"conversations": len(self.conversations), "turns": self.turns, "system_len": self.system_len,
                "user_len": self.user_len, "prefix_reuse_ratio": reuse.ratio, "prefix_reuse_unit": reuse.unit}


def synthetic_conversations(num_conversations: int, shape: MultiTurnShape = MultiTurnShape(),
                            seed: int = 0) -> MultiTurnWorkload:
    """``num_conversations`` conversations of random token ids that share one system prompt.

    Turn k's prompt is ``system + user_1 + reply_1 + ... + user_k`` (token ids, below
    `RANDOM_TOKEN_ID_LIMIT`); each request asks for ``shape.output_len`` tokens. Every piece has a
    generator of its own seeded by (seed, conversation, turn), so conversation c is the same
    whatever the number of conversations or turns.

    Args:
        num_conversations: how many conversations (``--num-prompts``).
        shape: turns and lengths.
        seed: seeds every id.
    Raises:
        DatasetError: fewer than one conversation (bad lengths raise when ``shape`` is built).
    """
    if num_conversations < 1:
        raise DatasetError(f"--num-prompts (conversations, for multi-turn) must be >= 1, got {num_conversations}")

    def ids(name: str, n: int) -> list[int]:
        rng = random.Random(f"{seed}/{name}")  # a str seed hashes the same in every process
        return [rng.randrange(RANDOM_TOKEN_ID_LIMIT) for _ in range(n)]

    system = ids("system", shape.system_len)
    conversations = []
    for c in range(num_conversations):
        history, turns = list(system), []
        for k in range(shape.turns):
            prompt = history + ids(f"{c}/{k}/user", shape.user_len)
            turns.append(BenchRequest(prompt, len(prompt), shape.output_len))
            history = prompt + ids(f"{c}/{k}/reply", shape.output_len)
        conversations.append(tuple(turns))
    return MultiTurnWorkload(tuple(conversations), shape.turns, shape.system_len, shape.user_len)


def sharegpt_conversations(path: str | Path, num_conversations: int, count_tokens: Callable[[str], int],
                           max_turns: int = 4, output_len: int | None = None, seed: int = 0) -> MultiTurnWorkload:
    """Multi-turn conversations from a ShareGPT-format file.

    Each entry is ``{"conversations": [{"from": "system"|"human"|"gpt", "value": text}, ...]}``.
    Turn k's prompt is the text of every earlier message (a leading system message included) and
    the k-th human message, joined by `MESSAGE_SEPARATOR`; its output length is the k-th gpt
    reply's token count. A conversation ends at its first turn that `sharegpt_requests` would
    skip (prompt or reply under `SHAREGPT_MIN_TOKENS`, prompt over `SHAREGPT_MAX_PROMPT_TOKENS`,
    both over `SHAREGPT_MAX_TOTAL_TOKENS`), at a message out of the human/gpt alternation, or after
    ``max_turns``; one with fewer than two turns left is skipped, since it reuses nothing.

    Args:
        path: the JSON file.
        num_conversations: how many to sample (seeded, as `sharegpt_requests`).
        count_tokens: text -> number of tokens (the served model's tokenizer).
        max_turns: turns kept per conversation at most (``--multi-turn-turns``).
        output_len: fixed output length instead of each reply's length.
        seed: seeds the sampling.
    Raises:
        DatasetError: unreadable file, wrong shape, or too few usable conversations.
    """
    if num_conversations < 1 or max_turns < 1:
        raise DatasetError(f"--num-prompts ({num_conversations}) and --multi-turn-turns ({max_turns}) must be >= 1")
    rng = random.Random(seed)
    entries = read_sharegpt(path)
    rng.shuffle(entries)
    out: list[tuple[BenchRequest, ...]] = []
    for entry in entries:
        turns = _sharegpt_turns(entry, count_tokens, max_turns, output_len)
        if len(turns) >= 2:
            out.append(turns)
            if len(out) == num_conversations:
                return MultiTurnWorkload(tuple(out), max_turns)
    raise DatasetError(f"--dataset-path {path}: only {len(out)} usable multi-turn conversations (two turns or more within "
                       f"the length limits) for --num-prompts {num_conversations}; lower --num-prompts or use a larger file")


def _sharegpt_turns(entry: Any, count_tokens: Callable[[str], int], max_turns: int,
                    output_len: int | None) -> tuple[BenchRequest, ...]:
    """The usable turns of one ShareGPT entry (see `sharegpt_conversations`)."""
    messages = entry.get("conversations") if isinstance(entry, dict) else None
    history, question, turns = "", None, []
    for message in messages if isinstance(messages, list) else ():
        role = message.get("from") if isinstance(message, dict) else None
        text = message.get("value") if isinstance(message, dict) else None
        if not isinstance(text, str):
            break
        if role == "system" and not history and question is None:
            history = text
        elif role == "human" and question is None:
            question = text
        elif role == "gpt" and question is not None:
            prompt = _join(history, question)
            n_in = count_tokens(prompt)
            n_out = output_len if output_len is not None else count_tokens(text)
            if min(n_in, n_out) < SHAREGPT_MIN_TOKENS or n_in > SHAREGPT_MAX_PROMPT_TOKENS \
                    or n_in + n_out > SHAREGPT_MAX_TOTAL_TOKENS:
                break  # skipping it would leave a hole in the history; later turns only grow
            turns.append(BenchRequest(prompt, n_in, n_out))
            history, question = _join(prompt, text), None
            if len(turns) == max_turns:
                break
        else:
            break  # two questions in a row, a reply to nothing, an unknown role: the history is not a chat
    return tuple(turns)


def _join(history: str, message: str) -> str:
    return f"{history}{MESSAGE_SEPARATOR}{message}" if history else message
