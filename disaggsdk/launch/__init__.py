"""Starting a plan's processes: `LocalRuntime` runs every unit on this machine (the default),
`ray_runtime.RayRuntime` on a Ray cluster; both are a `runtime.Supervisor` with a `base.Launcher`.

Imported lazily: nothing here loads torch or the native library until a runtime starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disaggsdk.launch.base import LaunchError, UnitCannotRun

if TYPE_CHECKING:
    from disaggsdk.launch.launcher.supervisor import LocalRuntime
    from disaggsdk.launch.tiny import tiny_spec

__all__ = ["LaunchError", "LocalRuntime", "UnitCannotRun", "tiny_spec"]


def __getattr__(name: str) -> object:
    if name == "LocalRuntime":
        from disaggsdk.launch.launcher.supervisor import LocalRuntime

        return LocalRuntime
    if name == "tiny_spec":
        from disaggsdk.launch.tiny import tiny_spec

        return tiny_spec
    raise AttributeError(f"module 'disaggsdk.launch' has no attribute {name!r}")
