"""The system commands a testbed drives (iproute2's ``ip`` and ``tc``, util-linux's ``nsenter`` and
``unshare``) and the one way they are run: a failed command is a `TestbedError` carrying its stderr.

No Python netlink library: the project prefers iproute2, which every Linux with namespaces has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from disaggsdk.testbed.errors import TestbedError, TestbedUnavailable

REQUIRED_TOOLS = ("ip", "tc", "nsenter", "unshare", "mount", "hostname")
COMMAND_TIMEOUT_S = 30.0


def require_tools() -> None:
    """Check that this process can build network namespaces.

    Raises:
        TestbedUnavailable: not root, a command missing, or ``ip netns`` not working here; the
            message says what is needed.
    """
    if os.geteuid() != 0:
        raise TestbedUnavailable("the testbed needs root (it creates network, mount and pid namespaces): "
                                 "run it as root or with sudo")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise TestbedUnavailable(f"the testbed needs {', '.join(missing)} on PATH: "
                                 "install iproute2 and util-linux (apt-get install iproute2 util-linux)")
    # root is not enough in a container without CAP_NET_ADMIN / CAP_SYS_ADMIN: make (and remove) a
    # namespace of our own to know, rather than fail half-way through building a testbed
    probe_name = f"dsk-probe-{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", probe_name], capture_output=True, text=True,
                           timeout=COMMAND_TIMEOUT_S)
    if probe.returncode != 0:
        raise TestbedUnavailable(f"the testbed needs `ip netns add`, which fails here: {probe.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe_name], capture_output=True, timeout=COMMAND_TIMEOUT_S)


def run_tool(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run one command to completion and return its stdout.

    Raises:
        TestbedError: it exited non-zero or ran past ``timeout_s``; the message holds the command
            and its stderr.
    """
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"`{' '.join(argv)}` ran past {timeout_s:g} s") from exc
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def try_tool(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> bool:
    """Run one command for a teardown that must go on whatever fails; True when it exited 0."""
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout_s).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def process_runs(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has: only its parent's wait is missing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
