"""The JSON schema of a plan (docs/plan-json.md) and its rich / HTML faces."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from rich.console import Console

from disaggsdk.plan import SCHEMA_VERSION, make_plan
from tests.plan.helpers import make_spec

RANK_KEYS = {"index", "rank", "dp_rank", "tp_rank", "node", "gpu", "nic", "kv_heads", "replica_set"}
TRANSFER_KEYS = {"src_rank", "dst_rank", "heads", "writes_per_page_layer", "page_runs"}
RUN_KEYS = {
    "count", "length_bytes", "src_offset_bytes", "dst_offset_bytes", "src_stride_bytes",
    "dst_stride_bytes",
}


def test_json_has_the_documented_fields_and_round_trips():
    plan = make_plan(make_spec(8, 4, model="qwen3-coder", d_replicas=2, layout="NHD"))
    data = plan.to_json(num_tokens=100)
    assert json.loads(json.dumps(data)) == data
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert (data["num_tokens"], data["num_pages"]) == (100, 7)  # 99 tokens in pages of 16
    assert [i["name"] for i in data["instances"]] == ["prefill-0", "decode-0", "decode-1"]
    for inst in data["instances"]:
        for rank in inst["ranks"]:
            assert set(rank) == RANK_KEYS
    assert data["instances"][1]["ranks"][3]["kv_heads"] == [6, 8]
    assert data["instances"][1]["page_bytes"] == 16 * 2 * 2 * 128 * 2
    route = data["routes"][1]
    assert (route["prefill"], route["decode"], route["layout"]) == ("prefill-0", "decode-1", "NHD")
    for t in route["transfers"]:
        assert set(t) == TRANSFER_KEYS and set(t["page_runs"]["HND"]) == RUN_KEYS
        assert t["writes_per_page_layer"] == {"HND": 1, "NHD": 16}
    per_rank = route["expected_writes"]
    assert [r["dst_rank"] for r in per_rank] == [0, 1, 2, 3]
    assert [r["kv_writes"] for r in per_rank] == [7 * 62 * 2 * 16] * 4
    assert [r["context_writes"] for r in per_rank] == [1, 0, 0, 0]
    assert route["expected_writes_total"] == sum(r["total"] for r in per_rank)


def test_mla_json_marks_ranks_and_transfers_replicated():
    data = make_plan(make_spec(8, 1, model="deepseek-r1", d_dp=8, page_size=64)).to_json()
    assert {r["kv_heads"] for i in data["instances"] for r in i["ranks"]} == {"replicated"}
    (route,) = data["routes"]
    assert route["source_per_request"] is True
    assert [t["heads"] for t in route["transfers"]] == ["replicated"]


def test_plan_is_deterministic():
    spec = make_spec(8, 16, model="qwen3-coder", gpus_per_node=16, d_replicas=3, seed=5)
    assert make_plan(spec).to_json() == make_plan(spec).to_json()


def test_rich_and_html_show_ranks_and_routes():
    plan = make_plan(make_spec(8, 4, model="qwen3-coder"))
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(plan)
    text = console.export_text()
    assert "prefill-0 → decode-0" in text and "reconstruct" in text
    assert "0 heads [0, 1), 1 heads [1, 2)" in text
    html = plan._repr_html_()
    # ranks, routes, memory, weights by part, what does not fit (float32 weights: 240 GB a rank), transfers
    assert html.count("<table>") == 6 and "<script" not in html
    assert "memory per rank in GB" in html and "no room for KV" in html
    assert "prefill-0 → decode-0" in html and "[6, 7)" in html


def test_print_and_str_give_the_tables_a_terminal_shows_never_cut():
    """``print(plan)`` in a script: the rich tables as plain text, as wide as their cells (a memory
    problem with its fixes is one line), and IPython's text view the same; never the attrs fields."""
    from IPython.lib.pretty import pretty

    plan = make_plan(make_spec(8, 4, model="qwen3-coder"))  # float32 weights: does not fit, a long problem line
    console = Console(width=400, record=True, file=io.StringIO(), color_system=None)
    console.print(plan)
    terminal = "\n".join(line.rstrip() for line in console.export_text().splitlines())
    assert str(plan) == terminal == pretty(plan)
    assert not str(plan).startswith("Plan(") and "\x1b[" not in str(plan)
    (problem, *_) = plan.memory_problems
    assert problem in str(plan)  # whole: not cut to the width of a terminal that is not there
    assert repr(plan).startswith("Plan(spec=")  # repr stays the value's


def test_import_stays_light():
    code = (
        "import sys, disaggsdk.plan; from disaggsdk.plan import make_plan;"
        "assert 'torch' not in sys.modules and 'cffi' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _keys(value, out):
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(key)
            _keys(item, out)
    elif isinstance(value, list):
        for item in value:
            _keys(item, out)
    return out


def test_every_json_field_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "plan-json.md").read_text()
    keys = set()
    for spec in (make_spec(8, 16, gpus_per_node=16), make_spec(8, 1, model="deepseek-r1", d_dp=8)):
        _keys(make_plan(spec).to_json(), keys)
    forms = ("`{}`", ".{}`", "`{}.")
    missing = sorted(
        k for k in keys - {"HND", "NHD"} if not any(f.format(k) in doc for f in forms)
    )
    assert not missing, f"document these fields in docs/plan-json.md: {missing}"


def test_mtp_speculation_adds_the_mtp_layer_to_the_kv_that_moves():
    import attrs

    from disaggsdk.spec import Role, Spec, Speculative

    one = Role(tp=1, dp=1)
    plain = make_plan(Spec(model="deepseek-r1", prefill=one, decode=one))
    mtp = make_plan(attrs.evolve(plain.spec, speculative=Speculative("mtp", 1)))
    ngram = make_plan(attrs.evolve(plain.spec, speculative=Speculative("ngram", 1)))
    assert (plain.kv_layers, ngram.kv_layers, mtp.kv_layers) == (61, 61, 62)
    a, b = plain.to_json(num_tokens=1024), mtp.to_json(num_tokens=1024)
    assert (a["model"]["kv_layers"], b["model"]["kv_layers"], b["model"]["num_layers"]) == (61, 62, 61)
    writes = [d["routes"][0]["expected_writes_total"] for d in (a, b)]
    assert writes[1] - writes[0] == a["num_pages"]  # one more layer: one more write per page (MLA, 1:1)
