"""`bench.first_start` on a real server (`disaggsdk serve`, eager): the first completion's time from the
start, completions timed one after another until the duration, the server stopped and its process gone."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from disaggsdk.bench import first_start
from tests.spawned_ranks import free_port

pytest.importorskip("torch")


def test_times_the_first_completion_and_the_settled_latency_then_stops_the_server(capsys):
    port = free_port()
    command = [sys.executable, "-m", "disaggsdk.cli.main", "serve", "--model", "qwen3-tiny", "--port", str(port),
               "--no-live"]
    assert first_start.main(["--port", str(port), "--duration-s", "14", "--window", "2", "--max-tokens", "4",
                             "--", *command]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0 < result["first_completion_s"] < 14 and result["completions"] >= 2
    times = [c["at_s"] for c in result["latencies"]]
    assert times == sorted(times) and all(c["latency_s"] > 0 for c in result["latencies"])
    assert result["median_latency_last_s"] > 0 and result["compiled_lines"] == []  # the suite runs eagerly
    with pytest.raises(OSError):  # the port is free again: the server was stopped
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_a_command_that_never_serves_is_an_error_with_its_output():
    with pytest.raises(SystemExit, match="did not answer on port"):
        first_start.run([sys.executable, "-c", "print('no server here')"], free_port(), None, "x", 1, 5.0, 2, 3.0)
