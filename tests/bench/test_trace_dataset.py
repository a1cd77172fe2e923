"""JSON-lines traces: what a line may say, how runs sample them, and the errors for a bad file."""

from __future__ import annotations

import json

import pytest

from disaggsdk.bench.dataset import DatasetError
from disaggsdk.bench.trace_dataset import read_trace, trace_lengths, trace_requests


def _write(tmp_path, rows, name="trace.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_a_trace_gives_prompts_as_lengths_ids_or_text_and_runs_draw_their_own(tmp_path):
    path = _write(tmp_path, [{"input_len": 5, "output_len": 3, "kind": "chat"}, "",
                             {"prompt_token_ids": [1, 2, 3], "output_tokens": 2},
                             {"prompt": "hello there", "output_len": 4}])
    assert trace_lengths(path) == [(5, 3), (3, 2), (None, 4)]
    reqs = trace_requests(path, 3, count_tokens=len, seed=1)
    assert sorted((r.prompt_len, r.output_len) for r in reqs) == [(3, 2), (5, 3), (11, 4)]
    by_len = {r.prompt_len: r for r in reqs}
    assert by_len[3].prompt == [1, 2, 3] and by_len[11].prompt == "hello there"
    assert len(by_len[5].prompt) == 5
    # a length-only line gets fresh ids in each run: a sweep's runs do not hit each other's prefix cache
    again = [r for r in trace_requests(path, 3, count_tokens=len, seed=2) if r.prompt_len == 5]
    assert again[0].prompt != by_len[5].prompt
    assert trace_requests(path, 3, count_tokens=len, seed=1) == reqs  # the seed repeats a run
    more = trace_requests(path, 10, count_tokens=len, seed=1)  # more than the trace holds: with replacement
    assert len(more) == 10
    assert all(r.output_len == 7 for r in trace_requests(path, 2, count_tokens=len, output_len=7))


@pytest.mark.parametrize("line, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected an object"),
    ('{"output_len": 3}', "give the prompt once"),
    ('{"input_len": 3, "prompt": "x", "output_len": 3}', "give the prompt once"),
    ('{"input_len": 3}', "the answer's length"),
    ('{"input_len": 0, "output_len": 3}', "'input_len' must be a whole number >= 1"),
    ('{"input_len": 3, "output_len": 2.5}', "'output_len' must be a whole number >= 1"),
    ('{"prompt": "", "output_len": 3}', "non-empty text"),
    ('{"prompt_token_ids": [1, -2], "output_len": 3}', "list of token ids"),
])
def test_a_bad_line_names_its_file_line_and_the_fix(tmp_path, line, message):
    path = _write(tmp_path, [{"input_len": 4, "output_len": 2}, line])
    with pytest.raises(DatasetError, match=message) as exc:
        read_trace(path)
    assert f"{path}:2" in str(exc.value)


def test_an_empty_or_missing_trace_and_text_without_a_tokenizer_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="no requests"):
        read_trace(_write(tmp_path, [""]))
    with pytest.raises(DatasetError, match="cannot read it"):
        read_trace(tmp_path / "absent.jsonl")
    with pytest.raises(DatasetError, match="needs the served model's tokenizer"):
        trace_requests(_write(tmp_path, [{"prompt": "hi", "output_len": 2}]), 1)
    with pytest.raises(DatasetError, match="--num-prompts"):
        trace_requests(_write(tmp_path, [{"input_len": 2, "output_len": 2}]), 0)


def test_the_shipped_trace_mixes_short_chat_turns_and_long_edits():
    from disaggsdk.face.compare import trace_path

    lengths = trace_lengths(trace_path("code-assistant"))
    prompts = [n for n, _ in lengths if n is not None]
    assert len(lengths) == 200 and len(prompts) == 200
    assert sum(n <= 512 for n in prompts) > 100 and sum(n >= 768 for n in prompts) > 50


def test_trace_draws_give_a_measured_run_and_its_simulated_twin_the_same_requests(tmp_path):
    from disaggsdk.bench.trace_dataset import TraceDraws

    path = _write(tmp_path, [{"input_len": 5, "output_len": 3}, {"input_len": 9, "output_len": 2}])
    draws = TraceDraws(path)
    assert draws(4, 6) == trace_requests(path, 6, seed=4)  # what `bench --dataset-path --seed 4` sends
    assert draws(4, 6) == draws(4, 6) and draws(5, 6) != draws(4, 6)


def test_trace_draws_read_a_sharegpt_file_as_bench_does(tmp_path):
    from disaggsdk.bench.dataset import sharegpt_requests
    from disaggsdk.bench.trace_dataset import TraceDraws

    entries = [{"conversations": [{"value": f"question number {i} " * 3}, {"value": f"answer {i} " * 4}]}
               for i in range(6)]
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(entries))
    draws = TraceDraws(path, count_tokens=len)
    assert draws.dataset_name == "sharegpt" and TraceDraws(tmp_path / "t.jsonl").dataset_name == "custom"
    assert draws(3, 4) == sharegpt_requests(path, 4, len, seed=3)  # what `bench --dataset-path chats.json --seed 3` sends
    with pytest.raises(DatasetError, match="give the tokenizer"):
        TraceDraws(path)(3, 4)
