"""The shipped coding-agent trace: seeded sessions whose context grows by tool output each turn.

Writes ``disaggsdk/bench/traces/coding_agent_sessions.jsonl`` (the same bytes for the same seed):

    python -m disaggsdk.bench.coding_agent_trace [--out FILE] [--seed N] [--sessions N] [--turns N]

`coding_agent_sessions` says how it is shaped and why it is as large as it is.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from disaggsdk.bench.agent_trace import AgentSession, AgentTurn, agent_trace_lines
from disaggsdk.bench.dataset import RANDOM_TOKEN_ID_LIMIT

SHIPPED_TRACE = Path(__file__).resolve().parent / "traces" / "coding_agent_sessions.jsonl"
SHIPPED_SEED = 2026


@dataclass(frozen=True)
class CodingAgentShape:
    """Sessions and token lengths of the coding-agent trace (ranges are inclusive, drawn uniformly)."""

    num_sessions: int = 36
    num_turns: int = 8
    system_len: int = 512  # instructions and tool schemas, the same in every session
    repo_context_len: tuple[int, int] = (384, 640)  # the repository map and the task, one per session
    reply_len: tuple[int, int] = (32, 80)  # each agent reply: a tool call, a short edit
    tool_output_len: tuple[int, int] = (128, 320)  # what each tool call returned: a file, a test log
    max_context_tokens: int = 4096  # every request's prompt + reply fits (the spec's $.engine.max_model_len)


def coding_agent_sessions(shape: CodingAgentShape = CodingAgentShape(), seed: int = SHIPPED_SEED
                          ) -> tuple[AgentSession, ...]:
    """The coding-agent sessions: token ids below `RANDOM_TOKEN_ID_LIMIT`, exact and tokenizer-free.

    Turn 1 is the shared system prompt and the session's repository context (~1,000 tokens); turn
    k+1 adds turn k's recorded reply and a tool output, so the eighth prompt holds ~3,000 (3,342
    tokens at most, with its reply). Each piece has a generator seeded by (seed, session, turn,
    piece): session s is the same whatever the number of sessions or turns.

    Size, against specs/kv_tiers_agent.yaml's pool of 640 pages of 16 tokens (10,240 tokens: two
    and a half of the longest requests): the working set is the distinct KV pages of the sessions'
    final contexts (`working_set_pages`: the 32 pages of the shared system prompt once, and each
    session's own ~157), 5,690 pages for the 36 sessions of the shipped seed, 8.9x the pool; the
    test suite checks >= 8x against the spec. Replayed with every session open and at most two
    requests in flight, a session's next turn comes after ~35 other turns have passed through the
    pool, so without a second tier almost nothing of it is left.

    Raises:
        ValueError: a request that would not fit ``shape.max_context_tokens``.
    """

    def ids(name: str, bounds: tuple[int, int] | int) -> tuple[int, ...]:
        rng = random.Random(f"{seed}/{name}")  # a str seed hashes the same in every process
        n = bounds if isinstance(bounds, int) else rng.randint(*bounds)
        return tuple(rng.randrange(RANDOM_TOKEN_ID_LIMIT) for _ in range(n))

    system = ids("system", shape.system_len)
    sessions = []
    for s in range(shape.num_sessions):
        turns = [AgentTurn(system + ids(f"{s}/repo", shape.repo_context_len), ids(f"{s}/1/reply", shape.reply_len))]
        for k in range(2, shape.num_turns + 1):
            turns.append(AgentTurn(ids(f"{s}/{k}/tool", shape.tool_output_len), ids(f"{s}/{k}/reply", shape.reply_len)))
        session = AgentSession(s, tuple(turns))
        if len(session.final_context()) > shape.max_context_tokens:
            raise ValueError(f"session {s} grows to {len(session.final_context())} tokens, over "
                             f"max_context_tokens {shape.max_context_tokens}: shorten the turns")
        sessions.append(session)
    return tuple(sessions)


def working_set_pages(sessions: Sequence[AgentSession], page_size: int) -> int:
    """The distinct KV pages of the sessions' final contexts: a page is its tokens and every token
    before it (as a prefix cache keys it), so pages of a prefix that sessions share count once and
    each session's last, partial page counts on its own.

    Raises:
        ValueError: ``page_size`` below 1.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    pages: set[tuple[int, ...]] = set()
    for session in sessions:
        context = tuple(session.final_context())
        pages.update(context[:end] for end in range(page_size, len(context) + page_size, page_size))
    return len(pages)


def main(argv: Sequence[str] | None = None) -> None:
    """Write the trace (the shipped one unless told otherwise)."""
    parser = argparse.ArgumentParser(prog="python -m disaggsdk.bench.coding_agent_trace",
                                     description="Write the seeded coding-agent session trace.")
    parser.add_argument("--out", type=Path, default=SHIPPED_TRACE, help="where (default: the shipped trace)")
    parser.add_argument("--seed", type=int, default=SHIPPED_SEED)
    parser.add_argument("--sessions", type=int, default=CodingAgentShape.num_sessions)
    parser.add_argument("--turns", type=int, default=CodingAgentShape.num_turns)
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.turns < 1:
        parser.error("--sessions and --turns must be >= 1")
    sessions = coding_agent_sessions(CodingAgentShape(num_sessions=args.sessions, num_turns=args.turns), args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(agent_trace_lines(sessions))
    print(f"wrote {len(sessions)} sessions of {args.turns} turns to {args.out}")


if __name__ == "__main__":
    main()
