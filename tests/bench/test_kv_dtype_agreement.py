"""The fp8-KV agreement measurement: its comparison arithmetic, its held-out prompts, and the
command run small (the figures are computed and reported, not held to a threshold)."""

from __future__ import annotations

import json

import pytest

from disaggsdk.bench.code_corpus import held_out_prompts, held_out_windows
from disaggsdk.bench.kv_dtype_agreement import compare_outputs, main
from disaggsdk.engine.sampling_params import TokenLogprobs


def output(ids: list[int], logprobs: list[float]):
    from disaggsdk.engine.sequence import RequestOutput

    return RequestOutput("r", [], ids, True, new_logprobs=[TokenLogprobs(t, lp) for t, lp in zip(ids, logprobs)])


def test_outputs_are_compared_up_to_their_first_difference():
    reference = [output([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4]), output([5, 6, 7, 8], [-1.0, -1.0, -1.0, -1.0])]
    measured = [output([1, 2, 3, 4], [-0.1, -0.3, -0.3, -0.2]), output([5, 9, 9, 9], [-1.5, -2.0, -0.1, -0.1])]
    stats = compare_outputs(reference, measured)
    assert stats["token_agreement"] == pytest.approx(5 / 8)  # 4 of 4, then 1 of 4 before the difference
    assert stats["identical_outputs"] == 1
    # positions compared: all 4 of the first, then the second's common token and its first difference
    assert stats["positions_compared"] == 6
    assert stats["mean_abs_logprob_diff"] == pytest.approx((0 + 0.1 + 0 + 0.2 + 0.5 + 1.0) / 6)
    assert stats["max_abs_logprob_diff"] == pytest.approx(1.0)


def test_held_out_windows_extend_the_held_out_prompts_past_one_per_file():
    windows = held_out_windows(40, num_lines=12)
    first = held_out_prompts(40, num_lines=12)  # one per file with that much code
    assert len(windows) == 40 > len(first)
    assert windows[: len(first)] == first  # every file's first window, then second windows
    assert all(w.count("\n") == 12 for w in windows)


def test_the_command_prints_the_agreement_of_fp8_against_float32_kv(capsys):
    pytest.importorskip("torch")
    main(["--model", "qwen3-coder-tiny", "--prompts", "4", "--max-tokens", "6"])
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "qwen3-coder-tiny" and result["kv_dtype"] == "fp8"
    assert result["reference_kv_dtype"] == "float32" and result["num_prompts"] == 4 and result["max_tokens"] == 6
    assert 0.0 <= result["token_agreement"] <= 1.0 and 0 <= result["identical_outputs"] <= 4
    # every prompt compares at least its first token, at most all of them
    assert 4 <= result["positions_compared"] <= 4 * 6
    assert result["mean_abs_logprob_diff"] >= 0.0 and result["max_abs_logprob_diff"] >= result["mean_abs_logprob_diff"]
