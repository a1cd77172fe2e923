"""`disaggsdk plan`: tables or JSON for a spec file; errors become exit 2 without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disaggsdk.cli.main import main

SPECS = Path(__file__).resolve().parents[2] / "specs"


def test_json_of_qwen3_coder_spec(capsys):
    assert main(["plan", str(SPECS / "qwen3_coder.yaml"), "--json", "--tokens", "33"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema_version"] == 2 and data["num_tokens"] == 33 and data["num_pages"] == 2
    assert len(data["routes"]) == 3
    for route in data["routes"]:
        pairs = [(t["src_rank"], t["dst_rank"]) for t in route["transfers"]]
        assert pairs == [(i, i) for i in range(8)]
        assert {t["writes_per_page_layer"]["HND"] for t in route["transfers"]} == {1}
        assert route["expected_writes_total"] == 8 * 2 * 62 + 1


def test_tables_of_r1_dp_spec(capsys):
    assert main(["plan", str(SPECS / "r1_dp.yaml"), "--tokens", "65"]) == 0
    out = capsys.readouterr().out
    assert "replicated" in out and "prefill-0 → decode-0" in out and "per request" in out
    # the memory table: the eight ranks of each instance hold 32 of R1's 256 routed experts each (ep: 8)
    assert "memory per rank in GB" in out and out.count("32 each: [0, 32) .. [224, 256)") == 2
    assert "does not fit" not in out


def test_memory_json_and_a_plan_that_does_not_fit(tmp_path, capsys):
    assert main(["plan", str(SPECS / "r1_dp.yaml"), "--json"]) == 0
    decode = json.loads(capsys.readouterr().out)["instances"][1]["memory"]
    assert decode["ep"] == 8 and [r["experts"] for r in decode["ranks"]] == [[32 * i, 32 * (i + 1)] for i in range(8)]
    rank = decode["ranks"][0]
    assert rank["weights"]["total"] == sum(v for k, v in rank["weights"].items() if k != "total")
    assert rank["usable_bytes"] == int(0.9 * 141e9)
    assert rank["kv_pool_bytes"] <= rank["usable_bytes"] - rank["weights"]["total"] - rank["workspace_bytes"]
    assert decode["kv_tokens"] == 8 * rank["kv_tokens"] and decode["requests_at_8k"] == 8 * rank["requests_at_8k"]
    h100 = tmp_path / "h100.yaml"
    h100.write_text((SPECS / "r1_tp.yaml").read_text().replace("gpu: h200", "gpu: h100"))
    assert main(["plan", str(h100)]) == 2  # the tables, then what does not fit (on stderr)
    captured = capsys.readouterr()
    assert "does not fit" in captured.out and "$.prefill: prefill rank 0 needs 85.1 GB of weights" in captured.err


def test_negative_tokens_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(SPECS / "qwen3_coder.yaml"), "--tokens", "-3"])
    assert exc.value.code == 2
    assert "use 0 or more" in capsys.readouterr().err


def test_subprocess_bad_spec_exits_2_and_good_spec_prints_json(tmp_path, run_cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: qwen3-coder\ndecode: {tp: 3}\n")
    result = run_cli("plan", str(bad))
    assert result.returncode == 2, result
    assert "$.decode.tp" in result.stderr and "Traceback" not in result.stderr + result.stdout
    result = run_cli("plan", str(SPECS / "r1_tp.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {r["kv_heads"] for i in data["instances"] for r in i["ranks"]} == {"replicated"}
    assert all(len(r["transfers"]) == 8 for r in data["routes"])
