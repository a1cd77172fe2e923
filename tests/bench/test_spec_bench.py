"""The speculative-decoding benchmark runs end to end and reports what it measured (no timings asserted)."""

import pytest

pytest.importorskip("torch")

from disaggsdk.bench.code_corpus import held_out_prompts
from disaggsdk.bench.spec_bench import run_spec_bench


def test_spec_bench_reports_acceptance_speed_and_identical_greedy_tokens():
    result = run_spec_bench("qwen3-coder-tiny", "ngram", 2, [2], output_len=16, repeats=2, compile_step=False)
    (row,) = result["batches"]
    assert result["rounds"] == 2 and len(row["round_speedups"]) == 2 and all(r > 0 for r in row["round_speedups"])
    assert result["dtype"] == "float32"
    assert row["batch"] == 2 and row["identical_greedy_tokens"] is True
    assert row["acceptance"]["num_draft_tokens"] > 0 and len(row["acceptance"]["per_position_acceptance"]) == 2
    assert row["plain_tokens_per_s_per_request"] > 0 and row["speedup"] > 0


def test_held_out_prompts_are_code_from_files_no_checkpoint_saw():
    prompts = held_out_prompts(3, num_lines=10)
    assert len(prompts) == 3 and all(p.startswith(("def ", "class ")) and p.count("\n") == 10 for p in prompts)


def test_the_held_out_code_dataset_is_sharegpt(tmp_path):
    import json

    from disaggsdk.bench.code_corpus import main

    main(["--sharegpt", str(tmp_path / "code.json"), "--num-prompts", "2", "--num-lines", "5"])
    rows = json.loads((tmp_path / "code.json").read_text())
    assert len(rows) == 2 and [t["from"] for t in rows[0]["conversations"]] == ["human", "gpt"]
    assert rows[0]["conversations"][0]["value"].count("\n") == 5
