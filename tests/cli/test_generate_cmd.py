"""`disaggsdk generate`: works with no files on disk, JSON shape, user errors exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from disaggsdk.cli.main import main
from disaggsdk.engine.tokenizer import load_tokenizer


def test_tiny_catalog_model_from_text_with_no_files(tmp_path):
    # a fresh process in an empty directory: nothing on disk but the package
    cmd = [sys.executable, "-m", "disaggsdk.cli.main", "generate", "--model", "qwen3-coder-tiny",
           "--prompt", "hello", "--max-tokens", "16"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "tokens" in done.stdout and list(tmp_path.iterdir()) == []


def test_json_output_with_ids_text_and_logprobs(capsys):
    argv = ["generate", "--model", "qwen3-tiny", "--prompt", "hi", "--prompt-ids", "1,2,3",
            "--max-tokens", "4", "--ignore-eos", "--logprobs", "3", "--layout", "NHD", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    first, second = doc["outputs"]
    assert first["prompt_ids"] == load_tokenizer("qwen3-tiny").encode("hi")  # the shipped BPE, no bos
    assert second["prompt_ids"] == [1, 2, 3]
    for out in (first, second):
        assert len(out["token_ids"]) == 4 and out["finish_reason"] == "length"
        assert isinstance(out["text"], str)
        assert [lp["token_id"] for lp in out["logprobs"]] == out["token_ids"]
        assert all(len(lp["top"]) == 3 for lp in out["logprobs"])


def test_user_errors_exit_2(capsys):
    assert main(["generate", "--model", "qwen3-tiny"]) == 2
    assert "--prompt" in capsys.readouterr().err
    assert main(["generate", "--model", "qwen3-tiny", "--prompt-ids", "1,x"]) == 2
    assert main(["generate", "--model", "qwen3-tny", "--prompt", "a"]) == 2
    assert "did you mean 'qwen3-tiny'" in capsys.readouterr().err
    assert main(["generate", "--model", "qwen3-tiny", "--prompt", "a", "--tp", "3"]) == 2


def test_speculative_generation_gives_the_same_tokens_and_reports_acceptance(capsys):
    base = ["generate", "--model", "deepseek-r1-tiny", "--prompt", "def fib(n):", "--max-tokens", "24", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*base, "--speculative", "mtp", "--num-speculative-tokens", "2"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["outputs"][0]["token_ids"] == plain["outputs"][0]["token_ids"]
    assert spec["speculative"]["num_accepted_tokens"] > 0 and "speculative" not in plain
    assert main(["generate", "--model", "qwen3-tiny", "--prompt", "a", "--speculative", "mtp"]) == 2
    assert "no MTP layer" in capsys.readouterr().err
    assert main(["generate", "--spec", "specs/tiny_local.yaml", "--prompt", "a", "--speculative", "ngram"]) == 2
    assert "--speculative runs with --model" in capsys.readouterr().err
