"""Benchmark prompts from a JSON-lines trace: a user's own traffic, one request per line.

The format is vLLM's ``--dataset-name custom`` (``{"prompt": ..., "output_tokens": ...}``) widened to
what a trace of real traffic records without its text: each line gives the prompt as text
(``prompt``), as token ids (``prompt_token_ids``) or as a length alone (``input_len``, sent as random
token ids of that length), and the answer's length (``output_tokens`` or ``output_len``). Other keys
(an arrival time, a user id) are ignored: the benchmark's arrival process sets when each is sent.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from disaggsdk.bench.dataset import RANDOM_TOKEN_ID_LIMIT, BenchRequest, DatasetError, json_lines, sharegpt_requests

PROMPT_KEYS = ("prompt", "prompt_token_ids", "input_len")
OUTPUT_KEYS = ("output_tokens", "output_len")


def _positive_int(value: object, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DatasetError(f"{where}: {key!r} must be a whole number >= 1, got {value!r}")
    return value


def read_trace(path: str | Path) -> list[dict[str, object]]:
    """The lines of a JSON-lines trace, each checked to name its prompt and its output length.

    Raises:
        DatasetError: an unreadable file, a line that is not a JSON object, or one without a prompt
            (``prompt``, ``prompt_token_ids`` or ``input_len``) or an output length, with its line number.
    """
    rows: list[dict[str, object]] = []
    for where, row in json_lines(path):
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected an object such as {{\"input_len\": 512, \"output_len\": 64}}")
        prompt_keys = [k for k in PROMPT_KEYS if k in row]
        if len(prompt_keys) != 1:
            raise DatasetError(f"{where}: give the prompt once, as one of {', '.join(PROMPT_KEYS)} "
                               f"(found {prompt_keys or 'none'})")
        output_keys = [k for k in OUTPUT_KEYS if k in row]
        if len(output_keys) != 1:
            raise DatasetError(f"{where}: give the answer's length once, as {' or '.join(OUTPUT_KEYS)}")
        _positive_int(row[output_keys[0]], where, output_keys[0])
        key = prompt_keys[0]
        if key == "input_len":
            _positive_int(row[key], where, key)
        elif key == "prompt" and not (isinstance(row[key], str) and row[key]):
            raise DatasetError(f"{where}: 'prompt' must be non-empty text")
        elif key == "prompt_token_ids" and not (
                isinstance(row[key], list) and row[key] and all(isinstance(t, int) and t >= 0 for t in row[key])):
            raise DatasetError(f"{where}: 'prompt_token_ids' must be a non-empty list of token ids")
        rows.append(row)
    if not rows:
        raise DatasetError(f"--dataset-path {path}: the trace has no requests")
    return rows


def trace_lengths(path: str | Path) -> list[tuple[int | None, int]]:
    """(prompt tokens, output tokens) of every line of a trace; None where only text gives the prompt
    (its length depends on the tokenizer).

    Raises:
        DatasetError: as `read_trace`.
    """
    out: list[tuple[int | None, int]] = []
    for row in read_trace(path):
        output = row.get("output_tokens", row.get("output_len"))
        assert isinstance(output, int), "read_trace checked it"
        prompt = row.get("input_len", row.get("prompt_token_ids"))
        out.append((len(prompt) if isinstance(prompt, list) else prompt if isinstance(prompt, int) else None, output))
    return out


def trace_requests(path: str | Path, num_prompts: int, count_tokens: Callable[[str], int] | None = None,
                   output_len: int | None = None, seed: int = 0) -> list[BenchRequest]:
    """``num_prompts`` requests sampled (seeded) from a trace; see the module docstring.

    Args:
        count_tokens: text -> tokens in the served model's tokenizer, for lines that give text; None
            is enough for a trace of lengths and token ids.
        output_len: every answer's length instead of the trace's.
    Raises:
        DatasetError: as `read_trace`; a text prompt with no tokenizer to count it; ``num_prompts`` < 1.
    """
    if num_prompts < 1:
        raise DatasetError(f"--num-prompts must be >= 1, got {num_prompts}")
    rows = read_trace(path)
    rng = random.Random(seed)
    picked = rng.sample(rows, num_prompts) if num_prompts <= len(rows) else rng.choices(rows, k=num_prompts)
    out: list[BenchRequest] = []
    for row in picked:
        output = output_len or row.get("output_tokens", row.get("output_len"))
        assert isinstance(output, int), "read_trace checked it"
        prompt = row.get("prompt", row.get("prompt_token_ids", row.get("input_len")))
        if isinstance(prompt, int):
            out.append(BenchRequest([rng.randrange(RANDOM_TOKEN_ID_LIMIT) for _ in range(prompt)], prompt, output))
        elif isinstance(prompt, list):
            out.append(BenchRequest([int(t) for t in prompt], len(prompt), output))
        else:
            assert isinstance(prompt, str), "read_trace checked it"
            if count_tokens is None:
                raise DatasetError(f"--dataset-path {path}: a text prompt needs the served model's tokenizer "
                                   f"(--tokenizer) to count its tokens")
            out.append(BenchRequest(prompt, count_tokens(prompt), output))
    return out


@dataclass(frozen=True)
class TraceDraws:
    """The requests of a trace as bench draws them, by (seed, how many), each draw made once: a run
    measured by `disaggsdk bench --dataset-path` (which draws the same with the same seed) and its
    simulated twin read the very same requests.

    Args:
        path: a JSON-lines trace (`trace_requests`), or a ShareGPT JSON file (`dataset.sharegpt_requests`:
            first turns as prompts, the replies' lengths as output lengths) for any other suffix.
        count_tokens: text -> tokens in the served model's tokenizer, as bench counts them (needed
            for ShareGPT and for text prompts).
    """

    path: Path
    count_tokens: Callable[[str], int] | None = None
    _draws: dict[tuple[int, int], tuple[BenchRequest, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def dataset_name(self) -> str:
        """What `disaggsdk bench --dataset-name` reads the file as: custom (JSON lines) or sharegpt."""
        return "custom" if self.path.suffix == ".jsonl" else "sharegpt"

    def __call__(self, seed: int, num_prompts: int) -> list[BenchRequest]:
        """``num_prompts`` requests drawn with ``seed``.

        Raises:
            DatasetError: as `trace_requests` or `sharegpt_requests`; ShareGPT without ``count_tokens``.
        """
        key = (seed, num_prompts)
        if key not in self._draws:
            if self.dataset_name == "custom":
                drawn = trace_requests(self.path, num_prompts, self.count_tokens, seed=seed)
            elif self.count_tokens is None:
                raise DatasetError(f"{self.path}: a ShareGPT file's prompts are text: give the tokenizer to count them")
            else:
                drawn = sharegpt_requests(self.path, num_prompts, self.count_tokens, seed=seed)
            self._draws[key] = tuple(drawn)
        return list(self._draws[key])
