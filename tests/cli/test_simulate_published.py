"""`disaggsdk simulate --published [NAME]`: one case by name, its table, and bad input as one line and exit 2.

Every case at once, as JSON, runs in tests/docs/test_published_page.py (the docs page is its output).
"""

from __future__ import annotations

import json

import pytest


def test_a_named_case_prints_its_figures(run_cli):
    done = run_cli("simulate", "--published", "seed-r1-dp8", "--json")
    rows = json.loads(done.stdout)
    assert [(row["name"], row["metric"]) for row in rows] == [("seed-r1-dp8", "tokens/s per request, disaggregated")]
    (row,) = rows
    assert row["published"] == 50.0 and row["comparison"] == "about" and row["spec"] == "specs/published/seed_r1_dp8.yaml"
    assert row["aiconfigurator"] is None  # the seed states rates: nothing for the peer to run, installed or not
    assert done.returncode == (0 if row["holds"] else 1), done.stderr


def test_the_table_says_published_simulated_error_and_sources(run_cli):
    done = run_cli("simulate", "--published", "seed-r1-dp8")
    assert done.returncode in (0, 1), done.stderr
    for words in ("published vs simulated", "seed-r1-dp8", "~50", "holds", "AIConfigurator",
                  "seed-r1-dp8 load: open loop: Poisson arrivals at 8 QPS",
                  "seed-r1-dp8 kernel sources: ", "gemm: aiconfigurator-core 0.12.0 h200_sxm/gemm/sglang/0.5.14",
                  "ep_combine, ep_dispatch: aiconfigurator-core", "rmsnorm: roofline (profile h200)"):
        assert words in done.stdout, words


@pytest.mark.parametrize("args, message", [
    (("--published", "seed-r1"), "error: --published: no published case 'seed-r1'; did you mean 'seed-r1-tp8'? use one "
                                 "of seed-r1-tp8, seed-r1-dp8, lmsys-r1-96xh100, dynamo-qwen3-32b-fp8"),
    (("--published", "--request-rate", "3"), "error: --published simulates each case with the workload and settings "
                                             "its source states: drop --request-rate"),
    (("--published", "seed-r1-tp8", "--compare", "--qps", "2"), "drop --request-rate, --compare"),
    (("specs/r1_tp.yaml", "--no-aiconfigurator"), "error: --no-aiconfigurator goes with --published"),
    ((), "error: simulate: give a SPEC file, or --published [NAME] for the published deployments"),
])
def test_bad_input_is_one_line_and_exit_2(run_cli, args, message):
    done = run_cli("simulate", *args)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


@pytest.mark.slow
def test_every_case_as_a_table(run_cli):
    done = run_cli("simulate", "--published", "--no-aiconfigurator", timeout_s=600)
    assert done.returncode in (0, 1), done.stderr
    for name in ("seed-r1-tp8", "seed-r1-dp8", "lmsys-r1-96xh100", "dynamo-qwen3-32b-fp8"):
        assert f"{name} kernel sources:" in done.stdout, name
    assert "dynamo-qwen3-32b-fp8 load: closed loop: fixed concurrency" in done.stdout
