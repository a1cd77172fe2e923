"""Benchmark prompts: random token ids of given lengths, or a ShareGPT-format JSON file.

Both follow vLLM's ``bench serve``: random lengths are uniform in
``[len * (1 - range_ratio), len * (1 + range_ratio)]``; ShareGPT conversations give the first
turn as the prompt and the length of the second as the output length.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disaggsdk.errors import DisaggError

# Random prompts draw ids below 256: valid for every model we serve (the tiny models' byte
# vocabulary and any real tokenizer), so the same load runs against any server.
RANDOM_TOKEN_ID_LIMIT = 256
SHAREGPT_MIN_TOKENS = 4
SHAREGPT_MAX_PROMPT_TOKENS = 1024
SHAREGPT_MAX_TOTAL_TOKENS = 2048


class DatasetError(DisaggError):
    """A benchmark dataset or length setting that cannot be used."""


@dataclass(frozen=True)
class BenchRequest:
    """One prompt to send: text or token ids, and how many tokens to ask for."""

    prompt: str | list[int]
    prompt_len: int
    output_len: int


def _lengths(rng: random.Random, mean: int, range_ratio: float, n: int, name: str) -> list[int]:
    if mean < 1:
        raise DatasetError(f"--{name} must be >= 1, got {mean}")
    lo, hi = max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def random_requests(num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    seed: int = 0) -> list[BenchRequest]:
    """``num_prompts`` prompts of random token ids.

    Args:
        num_prompts: how many.
        input_len: mean prompt length in tokens.
        output_len: mean output length in tokens.
        range_ratio: lengths are uniform in ``[len * (1 - r), len * (1 + r)]``; 0 is exact.
        seed: seeds lengths and ids.
    Raises:
        DatasetError: a length below 1 or a range ratio outside [0, 1).
    """
    if not 0 <= range_ratio < 1:
        raise DatasetError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    if num_prompts < 1:
        raise DatasetError(f"--num-prompts must be >= 1, got {num_prompts}")
    rng = random.Random(seed)
    inputs = _lengths(rng, input_len, range_ratio, num_prompts, "input-len")
    outputs = _lengths(rng, output_len, range_ratio, num_prompts, "output-len")
    return [
        BenchRequest([rng.randrange(RANDOM_TOKEN_ID_LIMIT) for _ in range(n_in)], n_in, n_out)
        for n_in, n_out in zip(inputs, outputs)
    ]


def json_lines(path: str | Path) -> Iterator[tuple[str, object]]:
    """Each non-blank line of a JSON-lines file, parsed, with where it is (``"path:line"``, for messages).

    Raises:
        DatasetError: an unreadable file, or a line that is not JSON (with its line number).
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise DatasetError(f"--dataset-path {path}: cannot read it ({exc.strerror})") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not JSON ({exc.msg})") from None


def read_sharegpt(path: str | Path) -> list[Any]:
    """The entries of a ShareGPT-format file (a JSON list), unchecked beyond that.

    Raises:
        DatasetError: unreadable file, not JSON, or not a list.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"--dataset {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, list):
        raise DatasetError(f"--dataset {path}: expected a JSON list of ShareGPT entries with 'conversations'")
    return data


def sharegpt_requests(path: str | Path, num_prompts: int, count_tokens, output_len: int | None = None,
                      seed: int = 0) -> list[BenchRequest]:
    """Prompts from a ShareGPT-format file (a list of ``{"conversations": [{"value": ...}, ...]}``).

    Args:
        path: the JSON file.
        num_prompts: how many to sample (seeded).
        count_tokens: text -> number of tokens (the served model's tokenizer).
        output_len: fixed output length instead of the reply's length.
        seed: seeds the sampling.
    Raises:
        DatasetError: unreadable file, wrong shape, or too few usable conversations.
    """
    rng = random.Random(seed)
    entries = read_sharegpt(path)
    rng.shuffle(entries)
    out: list[BenchRequest] = []
    for entry in entries:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt, reply = turns[0].get("value"), turns[1].get("value")
        if not isinstance(prompt, str) or not isinstance(reply, str):
            continue
        n_in = count_tokens(prompt)
        n_out = output_len if output_len is not None else count_tokens(reply)
        if n_in < SHAREGPT_MIN_TOKENS or n_out < SHAREGPT_MIN_TOKENS:
            continue  # too short to time (vLLM's filter)
        if n_in > SHAREGPT_MAX_PROMPT_TOKENS or n_in + n_out > SHAREGPT_MAX_TOTAL_TOKENS:
            continue
        out.append(BenchRequest(prompt, n_in, n_out))
        if len(out) == num_prompts:
            return out
    raise DatasetError(f"--dataset {path}: only {len(out)} usable conversations for --num-prompts {num_prompts}; "
                       f"lower --num-prompts or use a larger file")
