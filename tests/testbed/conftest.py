"""The `testbed` fixture: build testbeds in a test and have them taken down when it ends, passed
or failed. Tests that use it skip where this user cannot make network namespaces (not root, no
iproute2), with the reason."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from disaggsdk.testbed import LinkSpec, Testbed, TestbedUnavailable, down, require_tools, up
from disaggsdk.testbed.tools import REQUIRED_TOOLS
from tests.declared_skips import not_root

_serial = itertools.count()


def netns_skip_reason() -> str | None:
    """Why this machine cannot build a testbed, or None if it can. Not being root (or root without
    the capabilities to make namespaces, as in some containers) is a declared skip; a missing tool
    is not (`make install` installs iproute2), so that skip fails the run (tests/declared_skips.py)."""
    if os.geteuid() != 0:
        return not_root("the testbed makes network, mount and pid namespaces")
    try:
        require_tools()
    except TestbedUnavailable as exc:
        tools_present = all(shutil.which(tool) for tool in REQUIRED_TOOLS)
        return not_root(f"root here cannot make namespaces: {exc}") if tools_present else str(exc)
    return None


def unique_name() -> str:
    """A testbed name no other test or test process uses at the same time."""
    return f"t{os.getpid()}x{next(_serial)}"


@pytest.fixture
def testbed(tmp_path: Path) -> Iterator[Callable[..., Testbed]]:
    """A factory ``testbed(nodes=2, link=LinkSpec(100), **up_kwargs) -> Testbed``; every testbed it
    made is taken down after the test, whatever the test did. State files go under ``tmp_path``."""
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    made: list[str] = []
    state_dir = tmp_path / "testbed-state"

    def make(nodes: int = 2, link: LinkSpec | None = None, **kwargs: object) -> Testbed:
        name = unique_name()
        made.append(name)  # before `up`: a testbed that fails half-way is cleared as well
        return up(nodes, link or LinkSpec(rate_mbit=100), name=name, state_dir=state_dir, **kwargs)

    try:
        yield make
    finally:
        for name in made:
            down(name, state_dir)


def host_network() -> dict[str, set[tuple[str, ...]]]:
    """The host namespace's interfaces, addresses and qdiscs (read-only: ``ip -j``, ``tc -j``)."""

    def shown(*argv: str) -> list[dict[str, object]]:
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
        return json.loads(out) if out else []

    links = {(str(link["ifname"]),) for link in shown("ip", "-j", "link", "show")}
    addresses = {(str(link["ifname"]), str(addr["local"])) for link in shown("ip", "-j", "addr", "show")
                 for addr in link.get("addr_info", [])}  # type: ignore[attr-defined]
    qdiscs = {(str(q["dev"]), str(q["kind"]), str(q.get("handle"))) for q in shown("tc", "-j", "qdisc", "show")}
    return {"links": links, "addresses": addresses, "qdiscs": qdiscs}


def host_mounts() -> set[tuple[str, str]]:
    """(mount point, filesystem type) of every mount the host's mount namespace shows, but
    /run/netns itself: the first ``ip netns add`` on a machine bind-mounts it (iproute2's own
    bookkeeping, left for every later namespace); the namespaces under it are compared."""
    found = set()
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[4] != "/run/netns":
                found.add((fields[4], fields[fields.index("-") + 1]))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def pids_in_netns(namespace: str) -> list[int]:
    """Host pids of the processes in network namespace ``namespace`` (read from /proc, nothing entered)."""
    inode = os.stat(f"/run/netns/{namespace}").st_ino
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                found.append(int(entry))
        except OSError:
            continue
    return found


def netns_names() -> set[str]:
    """Every network namespace ``ip netns`` knows."""
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout.strip()
    return {entry["name"] for entry in (json.loads(out) if out else [])}
