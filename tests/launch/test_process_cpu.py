"""CPU time of a process tree, read from /proc (what calibration charges to idle units)."""

import os
import signal
import subprocess
import sys
import time

from disaggsdk.launch.launcher.units import _process_tree, process_tree_cpu_s

SPIN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"
SPIN_AND_FORK = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {SPIN.format(s=0.6) + "time.sleep(30)"!r}])
{SPIN.format(s=0.3)}
print("spun", flush=True)
time.sleep(30)
"""


def test_cpu_time_counts_a_process_and_its_live_children():
    parent = subprocess.Popen([sys.executable, "-c", SPIN_AND_FORK], stdout=subprocess.PIPE, text=True)
    tree = [parent.pid]
    try:
        assert parent.stdout.readline().strip() == "spun"
        deadline = time.monotonic() + 20
        while process_tree_cpu_s(parent.pid) < 0.85 and time.monotonic() < deadline:
            time.sleep(0.1)  # the child spins 0.6 s beside the parent's 0.3 s
        tree = _process_tree(parent.pid)
        assert len(tree) == 2
        assert process_tree_cpu_s(parent.pid) >= 0.85
    finally:
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait()
        parent.stdout.close()
    assert process_tree_cpu_s(parent.pid) == 0.0  # gone: nothing to read
