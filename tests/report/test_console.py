"""The CLI's tables use the width they are given: a terminal's, COLUMNS, or enough for the table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.table import Table

from disaggsdk.report.console import UNBOUNDED_COLUMNS, make_console, plain_text

ROOT = Path(__file__).resolve().parents[2]
HEADERS = ("TTFT mean ms", "TTFT p99 ms", "TPOT mean ms", "ITL p99 ms", "tok/s/req", "busiest")


def wide_table() -> Table:
    table = Table()
    for header in ("transfers", "KV B/token/rank", "expected writes for 1024 tokens") * 4:
        table.add_column(header)
    table.add_row(*["12,345,678"] * 12)
    return table


def test_piped_without_columns_is_wide_enough_for_the_table(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    console = make_console()
    assert console.width == UNBOUNDED_COLUMNS
    console.print(wide_table())
    out = capsys.readouterr().out
    assert "…" not in out and out.count("KV B/token/rank") == 4
    assert max(map(len, out.splitlines())) < UNBOUNDED_COLUMNS  # the table's own width, not the ceiling


def test_force_color_on_a_pipe_does_not_bring_back_80_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert make_console(stderr=True).width == UNBOUNDED_COLUMNS


def test_columns_is_obeyed(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert make_console().width == 100


@pytest.mark.parametrize("columns", [None, "80"])
def test_a_piped_cli_table_is_cut_only_when_columns_says_so(columns):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    if columns is not None:
        env["COLUMNS"] = columns
    # simulate: a torch-free command whose table is ~110 columns wide (1 s)
    proc = subprocess.run([sys.executable, "-m", "disaggsdk.cli.main", "simulate", "specs/r1_dp.yaml",
                           "--duration-s", "30"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    if columns is None:
        assert "…" not in proc.stdout and all(h in proc.stdout for h in HEADERS), proc.stdout
    else:  # the user asked for 80: rich fits the table into it (the control: this table does not fit 80)
        assert max(map(len, proc.stdout.splitlines())) <= 80 and "tok/s/req" not in proc.stdout


def test_plain_text_is_the_whole_table_without_colour_or_trailing_spaces():
    text = plain_text(wide_table())
    assert "…" not in text and "\x1b[" not in text and text.count("KV B/token/rank") == 4
    assert all(line == line.rstrip() for line in text.splitlines())
