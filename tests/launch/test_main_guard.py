"""A script that launches at its top level without ``if __name__ == "__main__":`` (issue 38 item 3):
one clear error that shows the guard, nothing left behind; a guarded launch is not refused."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

from disaggsdk.launch.launcher.main_guard import _guarded

UNGUARDED = """
from disaggsdk import Cluster

deployment = Cluster().prefill(tp=1).decoders(1).model("qwen3-coder-tiny").device("cpu").launch(
    port=0, log_dir={log_dir!r})
deployment.shutdown()
"""


def test_an_unguarded_script_gets_one_error_with_the_guard_and_leaves_nothing(tmp_path):
    log_dir, temp = tmp_path / "logs", tmp_path / "tmp"
    temp.mkdir()
    script = tmp_path / "serve_it.py"
    script.write_text(UNGUARDED.format(log_dir=str(log_dir)))
    # the runtime's own temporary folders would land in TMPDIR: it must stay empty too
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "TMPDIR": str(temp)})
    assert p.returncode != 0
    assert p.stderr.count("Traceback") == 1, p.stderr  # the script's own, not one per unit process
    assert "bootstrapping" not in p.stderr and "spawn_main" not in p.stderr
    assert f"{script}:4 launches at the top level of the script" in p.stderr
    assert 'if __name__ == "__main__":' in p.stderr
    assert not log_dir.exists() and list(temp.iterdir()) == []


def test_a_guarded_script_is_not_refused(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent("""
        from disaggsdk.launch.launcher.main_guard import check_main_guarded

        def main():
            check_main_guarded()
            print("allowed")

        if __name__ == "__main__":
            main()
        else:
            check_main_guarded()  # a spawned child would run this branch: refused
    """))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "allowed", p.stderr


def test_which_lines_the_guard_covers():
    tree = ast.parse(textwrap.dedent("""\
        x = 1
        if "__main__" == __name__:
            launch()
        else:
            launch()
        try:
            if __name__ == "__main__":
                launch()
        finally:
            pass
        if True:
            launch()
    """))
    assert [_guarded(tree.body, line) for line in (1, 3, 5, 8, 12)] == [False, True, False, True, False]
