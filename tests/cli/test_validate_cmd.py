"""`disaggsdk validate`: exit 0 on good specs; exit 2, no traceback, place + fix on bad ones."""

import pytest

GOOD = "model: qwen3-coder\nprefill: {tp: 8}\ndecode: {replicas: 3, tp: 8}\n"

# (name, file text or None for a missing file, what the message must contain)
MALFORMED = [
    ("unknown key", "model: qwen3-coder\ndecod: {tp: 8}\n", "$.decod: unknown key; did you mean 'decode'?"),
    ("bad type", "model: qwen3-coder\ndecode: {tp: eight}\n", "$.decode.tp: expected an integer, got 'eight'"),
    ("tp not dividing heads", "model: deepseek-r1\nprefill: {tp: 3}\n", "$.prefill.tp: tp=3 does not divide the 128 query heads"),
    ("tp zero", "model: qwen3-coder\ndecode: {tp: 0}\n", "$.decode.tp: must be a positive number, got 0"),
    ("instance larger than a node", "model: deepseek-r1\ndecode: {tp: 4, dp: 3}\n", "does not fit a node of 8 GPUs"),
    ("unknown model", "model: llama-99\n", "$.model: unknown model 'llama-99'"),
    ("bad layout", "model: qwen3-coder\nkv: {layout: HDN}\n", "$.kv.layout: 'HDN' is not valid; use one of HND, NHD"),
    ("yaml syntax error", "model: qwen3-coder\nprefill:\n  tp: 8\n   dp: 1\n", "spec.yaml:4:6: YAML syntax error"),
    ("missing file", None, "spec file not found"),
    ("empty file", "", "the spec is empty; write at least `model: "),
]


@pytest.mark.parametrize("name, text, expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_spec_exits_2_with_place_and_fix(name, text, expected, tmp_path, run_cli):
    path = tmp_path / "spec.yaml"
    if text is not None:
        path.write_text(text)
    result = run_cli("validate", str(path))
    assert result.returncode == 2, result
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_good_spec_exits_0(tmp_path, run_cli):
    (tmp_path / "good.yaml").write_text(GOOD)
    result = run_cli("validate", str(tmp_path / "good.yaml"))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_every_problem_is_printed(tmp_path, run_cli):
    (tmp_path / "spec.yaml").write_text("model: qwen3-coder\nprefill: {tp: 0}\ndecode: {tp: 0}\nkv: {layout: X}\n")
    result = run_cli("validate", str(tmp_path / "spec.yaml"))
    assert result.returncode == 2
    assert "3 problem(s)" in result.stderr
    for path in ("$.prefill.tp", "$.decode.tp", "$.kv.layout"):
        assert path in result.stderr


def test_help_on_every_command(run_cli):
    top = run_cli("--help")
    assert top.returncode == 0
    from disaggsdk.cli.main import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert "validate" in commands
    for name in commands:
        result = run_cli(name, "--help")
        assert result.returncode == 0 and "usage: disaggsdk " + name in result.stdout
