"""`disaggsdk simulate --published` over every published case, and docs/published.md, the page generated from
its output (`disaggsdk.sim.published_page`): the committed page fails this test once a case, a spec or the
simulator changes a figure, until it is written again (``python -m disaggsdk.sim.published_page --write``).

The command runs once for the module, as a real process (~15-25 s on a 2-core machine), without the
AIConfigurator peer, which the project's environment does not install (tests/sim/test_aiconfigurator_peer.py
reads its saved output).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from disaggsdk.sim import published_page
from disaggsdk.sim.kernels import KERNEL_KINDS
from disaggsdk.sim.published import CASES
from tests.conftest import ROOT

KEYS = {"name", "metric", "unit", "claim", "comparison", "published", "simulated", "error", "holds", "aiconfigurator",
        "aiconfigurator_note", "sources", "detail", "load", "source", "spec"}


@pytest.fixture(scope="module")
def command() -> tuple[int, list[dict[str, Any]]]:
    """The exit status and the JSON rows of ``disaggsdk simulate --published --json --no-aiconfigurator``."""
    done = subprocess.run([sys.executable, "-m", "disaggsdk.cli.main", "simulate", "--published", "--json",
                           "--no-aiconfigurator"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_command_prints_one_object_per_figure_of_every_case(command):
    status, rows = command
    assert [(row["name"], row["metric"]) for row in rows] == \
        [(case.name, figure.metric) for case in CASES for figure in case.figures]
    for row in rows:
        assert set(row) == KEYS, row["name"]
        assert row["simulated"] is not None and row["simulated"] > 0, row
        if row["comparison"] == "about":
            assert row["error"] == pytest.approx(row["simulated"] / row["published"] - 1)
            assert row["holds"] == (abs(row["error"]) <= 0.25)
        else:
            assert row["error"] is None
            assert row["holds"] == (row["simulated"] > row["published"] if row["comparison"] == "above"
                                    else row["simulated"] < row["published"])
        assert row["aiconfigurator"] is None and row["aiconfigurator_note"] is None  # --no-aiconfigurator
        assert set(row["sources"]) <= set(KERNEL_KINDS) and {"gemm", "rmsnorm"} <= set(row["sources"])
        # each kind's source: the GPU's measured tables, or the roofline of its one shipped profile
        assert all(source.startswith(("aiconfigurator-core 0.12.0 ", "roofline (profile h"))
                   for source in row["sources"].values())
    assert status == (0 if all(row["holds"] for row in rows) else 1)


def test_each_figure_names_the_load_model_it_was_simulated_under(command):
    _, rows = command
    loads = {row["name"]: row["load"] for row in rows}
    assert loads["seed-r1-tp8"] == "open loop: Poisson arrivals at 3 QPS"
    assert loads["lmsys-r1-96xh100"].startswith("no serving load: ")
    # the guide measured with AIPerf at a fixed concurrency: the simulator sweeps a closed loop likewise
    assert loads["dynamo-qwen3-32b-fp8"].startswith("closed loop: fixed concurrency (AIPerf --concurrency N")
    for row in rows:
        if row["name"] == "dynamo-qwen3-32b-fp8":
            assert "clients (" in row["detail"] and "a GPU)" in row["detail"], row["detail"]


def test_the_committed_page_is_what_the_generator_writes_from_the_command(command):
    _, rows = command
    committed = (ROOT / published_page.PAGE).read_text(encoding="utf-8")
    assert committed == published_page.render_markdown(rows), \
        f"docs/published.md is stale: run `{published_page.REGENERATE}`"


def test_the_page_is_in_the_site_and_names_its_generator(command):
    _, rows = command
    page = published_page.render_markdown(rows)
    assert published_page.REGENERATE in page and "| case | figure |" in page
    assert "published.md" in (ROOT / "mkdocs.yml").read_text()
    assert "(published.md)" in (ROOT / "docs" / "index.md").read_text()
