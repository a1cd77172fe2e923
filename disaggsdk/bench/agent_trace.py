"""Agent session traces: JSON lines, one turn a line, whose sessions resend a context that grows.

A line is ``{"session_id": S, "turn": K, "new_token_ids": [...], "output_token_ids": [...]}``. Turn
K's prompt is turn K-1's prompt, turn K-1's ``output_token_ids`` (the reply as the agent saw it)
and turn K's ``new_token_ids`` (tool output, user text; at turn 1 the whole first context); it asks
for ``len(output_token_ids)`` tokens. A session's lines come in turn order, sessions interleaved in
any way. The server's replies never enter a prompt, so every run sends the same prompts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from disaggsdk.bench.dataset import BenchRequest, DatasetError, json_lines
from disaggsdk.bench.multi_turn import MultiTurnWorkload

TURN_KEYS = ("session_id", "turn", "new_token_ids", "output_token_ids")


@dataclass(frozen=True)
class AgentTurn:
    """One turn of a session: what it adds to the context, and the reply the trace recorded."""

    new_token_ids: tuple[int, ...]  # after the previous prompt and reply (turn 1: the first context)
    output_token_ids: tuple[int, ...]  # the recorded reply; its length is the turn's max_tokens


@dataclass(frozen=True)
class AgentSession:
    """One agent session: its turns in order."""

    session_id: int | str
    turns: tuple[AgentTurn, ...]

    def prompts(self) -> list[list[int]]:
        """Each turn's prompt: the previous prompt, the previous recorded reply, the turn's new tokens."""
        out: list[list[int]] = []
        context: list[int] = []
        for turn in self.turns:
            context = context + list(turn.new_token_ids)
            out.append(context)
            context = context + list(turn.output_token_ids)
        return out

    def final_context(self) -> list[int]:
        """The tokens the session's KV holds at its end: the last prompt and its recorded reply."""
        return self.prompts()[-1] + list(self.turns[-1].output_token_ids) if self.turns else []

    def requests(self) -> tuple[BenchRequest, ...]:
        """The turns as requests, in order."""
        return tuple(BenchRequest(prompt, len(prompt), len(turn.output_token_ids))
                     for prompt, turn in zip(self.prompts(), self.turns))


def agent_trace_lines(sessions: Sequence[AgentSession]) -> str:
    """The trace of ``sessions`` as JSON lines, interleaved: every session's turn 1, then every turn 2...

    Returns:
        the file's text, one line per turn, ending with a newline.
    """
    lines = []
    for k in range(max((len(s.turns) for s in sessions), default=0)):
        for session in sessions:
            if k < len(session.turns):
                turn = session.turns[k]
                lines.append(json.dumps({"session_id": session.session_id, "turn": k + 1,
                                         "new_token_ids": list(turn.new_token_ids),
                                         "output_token_ids": list(turn.output_token_ids)},
                                        separators=(",", ":")))
    return "".join(line + "\n" for line in lines)


def _token_ids(row: dict[str, object], key: str, where: str) -> tuple[int, ...]:
    value = row[key]
    if not (isinstance(value, list) and value
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
        raise DatasetError(f"{where}: {key!r} must be a non-empty list of token ids (whole numbers >= 0)")
    return tuple(value)


def read_agent_trace(path: str | Path) -> tuple[AgentSession, ...]:
    """The sessions of an agent trace (module docstring), in the order of their first lines.

    Raises:
        DatasetError: an unreadable file, a line that is not a JSON object with the four keys, token
            ids that are not whole numbers >= 0, a turn out of order within its session (each with
            its line number), or no turn at all.
    """
    turns: dict[int | str, list[AgentTurn]] = {}
    for where, row in json_lines(path):
        if not isinstance(row, dict) or any(key not in row for key in TURN_KEYS):
            raise DatasetError(f"{where}: expected an object with {', '.join(TURN_KEYS)} (an agent session trace)")
        session_id, turn = row["session_id"], row["turn"]
        if isinstance(session_id, bool) or not isinstance(session_id, (int, str)):
            raise DatasetError(f"{where}: 'session_id' must be a number or a string, got {session_id!r}")
        done = turns.setdefault(session_id, [])
        if isinstance(turn, bool) or turn != len(done) + 1:
            raise DatasetError(f"{where}: session {session_id!r} turn {turn!r} out of order: expected turn "
                               f"{len(done) + 1} (a session's lines come in turn order, from 1)")
        done.append(AgentTurn(_token_ids(row, "new_token_ids", where), _token_ids(row, "output_token_ids", where)))
    if not turns:
        raise DatasetError(f"--dataset-path {path}: the trace has no turns")
    return tuple(AgentSession(session_id, tuple(ts)) for session_id, ts in turns.items())


def agent_trace_workload(path: str | Path, max_sessions: int | None = None, max_turns: int | None = None,
                         output_len: int | None = None) -> MultiTurnWorkload:
    """The sessions of an agent trace as conversations for `disaggsdk bench` to replay.

    Args:
        path: the trace.
        max_sessions: the first this many sessions only (None: all).
        max_turns: each session's first this many turns only (None: all).
        output_len: every turn's max_tokens instead of its recorded reply's length (the prompts,
            which hold the recorded replies, are unchanged).
    Raises:
        DatasetError: as `read_agent_trace`; a limit or length below 1.
    """
    for flag, limit in (("--num-prompts", max_sessions), ("--multi-turn-turns", max_turns),
                        ("--output-len", output_len)):
        if limit is not None and limit < 1:
            raise DatasetError(f"{flag} must be >= 1 for --dataset-name agent-trace, got {limit}")
    sessions = read_agent_trace(path)[:max_sessions]
    conversations = tuple(tuple(BenchRequest(r.prompt, r.prompt_len, output_len or r.output_len)
                                for r in s.requests()[:max_turns]) for s in sessions)
    return MultiTurnWorkload(conversations, max(len(c) for c in conversations))
