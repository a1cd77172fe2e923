"""`disaggsdk testbed up|status|down`: the round trip from separate processes, and bad input or a
missing privilege as one line and exit 2."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import pytest

from disaggsdk.cli import main as cli_main
from disaggsdk.cli.required_extras import command_extras
from disaggsdk.testbed import down, load
from tests.testbed.conftest import netns_skip_reason, unique_name
from tests.testbed.test_testbed import RECEIVER, SENDER, TRANSFER_BYTES


def test_cli_up_status_down_round_trip(run_cli):
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    name = unique_name()
    try:
        started = run_cli("testbed", "up", "--nodes", "2", "--link", "100mbit", "--name", name, "--json")
        assert started.returncode == 0, started.stderr
        shown = json.loads(started.stdout)
        assert [(n["name"], n["address"]) for n in shown["nodes"]] == [(f"{name}-n0", "198.18.0.10"),
                                                                        (f"{name}-n1", "198.18.0.11")]
        assert shown["ray_address"] is None and shown["link"]["rate_mbit"] == 100
        # the nodes outlived the command that built them: a transfer from this process crosses them
        n0, n1 = load(name).nodes
        receiver = n1.popen([sys.executable, "-c", RECEIVER, n1.address])
        port = receiver.stdout.readline().strip()
        n0.run([sys.executable, "-c", SENDER, n1.address, port, str(TRANSFER_BYTES)])
        assert int(receiver.communicate(timeout=30)[0]) == TRANSFER_BYTES
        counted = run_cli("testbed", "status", "--name", name, "--json")
        assert counted.returncode == 0, counted.stderr
        nodes = json.loads(counted.stdout)["nodes"]
        assert [n["name"] for n in nodes] == [f"{name}-n0", f"{name}-n1"] and all(n["alive"] for n in nodes)
        assert nodes[0]["tx_bytes"] >= TRANSFER_BYTES and nodes[1]["rx_bytes"] >= TRANSFER_BYTES
        stopped = run_cli("testbed", "down", "--name", name)
        assert stopped.returncode == 0 and f"testbed {name} is down" in stopped.stdout
        gone = run_cli("testbed", "status", "--name", name, "--json")
        assert gone.returncode == 2 and f"no testbed named '{name}' is up" in gone.stderr
        assert run_cli("testbed", "down", "--name", name).returncode == 0  # again: nothing to do
    finally:
        down(name)


@pytest.mark.parametrize(("args", "says"), [
    (["--nodes", "two", "--link", "100mbit"], "--nodes 'two': give a whole number"),
    (["--nodes", "2", "--link", "100mbps"], "write a number and a bit unit"),
    (["--nodes", "2", "--link", "100mbit,5"], "write a number and us, ms or s"),
    (["--nodes", "0", "--link", "1gbit"], "--nodes 0: give 1 to 245"),
    (["--nodes", "2", "--link", "1gbit", "--name", "Bad-Name"], "use 1-16 lower-case letters and digits"),
    (["--nodes", "2", "--link", "1gbit", "--ray", "--ray-resources", "[1]"], "give a JSON object of numbers"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, capsys):
    if "--ray" in args and importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed: --ray is refused for that first")
    code = cli_main.main(["testbed", "up", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err


def test_without_root_it_says_root_is_needed(capsys, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    for action in (["status"], ["down"], ["up", "--nodes", "2", "--link", "1gbit"]):
        assert cli_main.main(["testbed", *action]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "the testbed needs root" in err


def test_ray_is_an_extra_only_with_ray():
    assert command_extras("testbed", argparse.Namespace(ray=True)) == ("ray",)
    assert command_extras("testbed", argparse.Namespace(ray=False)) == ()
