"""Starting a plan's processes: `start_local_runtime` runs every unit on this machine (the default),
`launcher.supervisor.start_ray_runtime` on a Ray cluster; both start a `launcher.supervisor.Supervisor`
with a `base.Launcher`.

What runs where: `launch.launcher` in the process that starts and supervises the units,
`launch.unit_process` inside each unit, and the modules here what both sides share (`base`: the
contract; `messages` and `channel`: what crosses between them; `health`: whether a unit is alive).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disaggsdk.launch.base import LaunchError, UnitCannotRun

if TYPE_CHECKING:
    from disaggsdk.launch.launcher.supervisor import start_local_runtime
    from disaggsdk.launch.tiny import tiny_spec

__all__ = ["LaunchError", "UnitCannotRun", "start_local_runtime", "tiny_spec"]


def __getattr__(name: str) -> object:
    if name == "start_local_runtime":
        from disaggsdk.launch.launcher.supervisor import start_local_runtime

        return start_local_runtime
    if name == "tiny_spec":
        from disaggsdk.launch.tiny import tiny_spec

        return tiny_spec
    raise AttributeError(f"module 'disaggsdk.launch' has no attribute {name!r}")
