"""Starting a plan's processes: `LocalRuntime` runs every unit on this machine (the default).

Imported lazily: nothing here loads torch or the native library until a runtime starts.
"""

from __future__ import annotations

__all__ = ["LaunchError", "LocalRuntime", "tiny_spec"]


def __getattr__(name: str):
    if name == "LocalRuntime":
        from disaggsdk.launch.runtime import LocalRuntime

        return LocalRuntime
    if name in ("LaunchError", "tiny_spec"):
        from disaggsdk.launch import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module 'disaggsdk.launch' has no attribute {name!r}")
