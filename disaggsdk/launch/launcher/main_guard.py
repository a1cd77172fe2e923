"""Refuse to launch from a script's unguarded top level, before any process starts.

Units start with multiprocessing's "spawn": each child imports the parent's main script again (as
``__mp_main__``) before running its unit. A script whose ``launch()`` is not under
``if __name__ == "__main__":`` would launch again in every child, which multiprocessing stops with
one bootstrapping traceback per child, after the parent made its log folders. So the parent looks
first: which top-level statement of ``__main__`` is running now, and is it under that guard?
"""

from __future__ import annotations

import ast
import sys
from types import FrameType

from disaggsdk.launch.base import LaunchError

GUARD_SNIPPET = 'if __name__ == "__main__":\n    deployment = Cluster()...launch()'


def check_main_guarded(frame: FrameType | None = None) -> None:
    """Raise when the running ``__main__`` script calls this from code a spawned child would run again.

    Args:
        frame: where to start looking up the stack (default: the caller's frame).
    Raises:
        LaunchError: the call comes from the top level of a script file, outside
            ``if __name__ == "__main__":``; the message shows the two lines to add.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:  # a REPL or a notebook: a spawned child imports no script
        return
    line = _main_module_line(main.__dict__, frame or sys._getframe(1))
    if line is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return  # not a source file we can read: let multiprocessing speak
    if not _guarded(tree.body, line):
        raise LaunchError(
            f"{path}:{line} launches at the top level of the script, which every unit process runs again when "
            f"it starts (multiprocessing's 'spawn'); put the launch under the main guard:\n\n"
            + "\n".join("    " + row for row in GUARD_SNIPPET.splitlines()))


def _main_module_line(main_globals: dict[str, object], frame: FrameType | None) -> int | None:
    """The line of ``__main__``'s top-level code now running (the outermost call on the stack that came
    from it), or None when the stack does not pass through it (a thread, an import)."""
    line = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main_globals:
            line = frame.f_lineno
        frame = frame.f_back
    return line


def _guarded(body: list[ast.stmt], line: int) -> bool:
    """Whether ``line`` lies in ``body`` under an ``if __name__ == "__main__":`` (its body, not its else)."""
    for stmt in body:
        if not stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            continue
        if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
            return any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in stmt.body)
        inner: list[list[ast.stmt]] = [getattr(stmt, name) for name in ("body", "orelse", "finalbody")
                                       if isinstance(getattr(stmt, name, None), list)]
        inner += [handler.body for handler in getattr(stmt, "handlers", [])]
        return any(_guarded(block, line) for block in inner)
    return False


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
