"""`disaggsdk validate`: exit 0 on good specs; exit 2, no traceback, place + fix on bad ones."""

import pytest

GOOD = ("model: qwen3-coder\nprefill: {tp: 8}\ndecode: {replicas: 3, tp: 8}\n"
        "engine: {dtype: bfloat16, memory_utilization: 0.95}\n")
R1 = "model: deepseek-r1\nengine: {dtype: bfloat16}\n"

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
    # memory (issue 35): R1's FP8 weights are ~86 GB per rank at tp 8; an H100 offers 0.9 x 80 = 72 GB
    ("r1 tp8 on h100", R1 + "hardware: {gpu: h100}\nprefill: {tp: 8}\ndecode: {tp: 8}\n",
     "$.prefill: prefill rank 0 needs 85.1 GB of weights and 3.2 GB of workspace (88.4 GB) and has 72.0 GB "
     "(0.9 x 80 GB h100), no room for KV: raise `$.prefill.tp` across nodes (to 16) or use `$.hardware.gpu: h200`"),
    ("r1 dp8 without ep", R1 + "prefill: {tp: 8}\ndecode: {tp: 1, dp: 8}\n",
     "$.decode: decode rank 0 needs 673.2 GB of weights and 3.7 GB of workspace (676.9 GB) and has 126.9 GB "
     "(0.9 x 141 GB h200), no room for KV: shard experts with `$.decode.ep: 8`"),
    ("ep neither 1 nor tp*dp", R1 + "decode: {tp: 2, dp: 4, ep: 4}\n",
     "$.decode.ep: ep=4 must be 1 or the instance's tp*dp = 2*4 = 8 ranks"),
    ("ep on a dense model", "model: qwen3-tiny\ndecode: {tp: 2, ep: 2}\n", "$.decode.ep: qwen3-tiny has no routed experts"),
    ("kv shorter than one max-length request", GOOD.replace("0.95", "0.9"),
     "$.decode: decode rank 0's KV pool holds 112,736 tokens (3.6 GB), less than one request of 262,144 tokens "
     "(qwen3-coder's context, max_position_embeddings); cap requests with `$.engine.max_model_len: 112640` or "
     "raise engine.memory_utilization"),
    ("max_model_len over the model's context", GOOD.replace("0.95}", "0.9, max_model_len: 300000}"),
     "$.engine.max_model_len: 300,000 tokens exceed qwen3-coder's 262,144-token context"),
    ("explicit pages over memory", "model: qwen3-coder-tiny\ndevice: cpu\nhardware: {gpu: cpu}\n"
     "engine: {num_pages: 4096}\n",
     "$.engine.num_pages: prefill rank 0's 4096 pages need 0.3 GB and its weights and workspace leave 0.2 GB"),
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


def test_r1_at_tp8_fits_one_h200_node_and_every_shipped_spec_fits(tmp_path, run_cli):
    from pathlib import Path

    (tmp_path / "r1.yaml").write_text(R1 + "prefill: {tp: 8}\ndecode: {replicas: 3, tp: 8}\n")
    shipped = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "specs").glob("*.yaml"))
    result = run_cli("validate", str(tmp_path / "r1.yaml"), *shipped)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("valid") == 1 + len(shipped) >= 8


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


def test_a_key_or_name_that_reads_as_rich_markup_is_printed_as_written(tmp_path, run_cli):
    # "[/]" closed no tag: rich raised MarkupError, a traceback (issue 55)
    (tmp_path / "bad.yaml").write_text('model: qwen3-coder-tiny\ndevice: cpu\nhardware: {gpu: cpu}\n"[/]": 1\n')
    bad = run_cli("validate", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2 and "$.[/]: unknown key" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    (tmp_path / "good.yaml").write_text('model: qwen3-coder-tiny\ndevice: cpu\nhardware: {gpu: cpu}\nname: "[/]"\n')
    good = run_cli("validate", str(tmp_path / "good.yaml"))
    assert good.returncode == 0 and "valid — [/]: model qwen3-coder-tiny" in good.stdout, good.stderr
