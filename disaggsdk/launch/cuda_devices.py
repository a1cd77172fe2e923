"""The CUDA devices of a `device: cuda` spec's units, and each unit's first CUDA call."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING

from disaggsdk.launch.base import LaunchError, UnitCannotRun

if TYPE_CHECKING:
    from disaggsdk.plan import Plan

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
TINY_HINT = "run on a GPU node, or add --tiny (tiny=True in Python) to run the same topology on the CPU"


def plan_devices(plan: Plan) -> dict[tuple[str, int], tuple[int, ...]]:
    """The launcher's device ids of every unit's ranks, in tp order (`launch.cuda_devices` applied).

    Returns:
        (instance name, dp rank) -> one device id per tp rank.
    Raises:
        LaunchError: ``launch.cuda_devices`` lists fewer devices than the plan has GPU slots.
    """
    gpus_per_node = plan.spec.hardware.gpus_per_node
    mapping = plan.spec.launch.cuda_devices
    num_slots = plan.num_nodes * gpus_per_node
    if mapping and len(mapping) < num_slots:
        raise LaunchError(f"launch.cuda_devices lists {len(mapping)} devices and the plan has {num_slots} GPUs "
                          f"({plan.num_nodes} nodes x {gpus_per_node}); give one device id per GPU, in plan order")
    devices: dict[tuple[str, int], tuple[int, ...]] = {}
    for inst in plan.instances:
        for dp_rank in range(inst.dp):
            slots = [r.node * gpus_per_node + r.gpu for r in inst.ranks if r.dp_rank == dp_rank]
            devices[(inst.name, dp_rank)] = tuple(mapping[s] if mapping else s for s in slots)
    return devices


def check_device_count(plan: Plan, num_devices: int) -> None:
    """Refuse a plan whose devices this machine lacks, naming the counts, before any unit starts.

    Args:
        plan: a `device: cuda` plan.
        num_devices: the CUDA devices the launcher sees (``torch.cuda.device_count()``).
    Raises:
        LaunchError: a device id the machine does not have.
    """
    needed = 1 + max((d for ids in plan_devices(plan).values() for d in ids), default=-1)
    if needed <= num_devices:
        return
    gpus = sum(len(inst.ranks) for inst in plan.instances)
    how = ("launch.cuda_devices names device ids up to " if plan.spec.launch.cuda_devices
           else f"the plan places its {gpus} ranks on GPUs 0..")
    raise LaunchError(f"{plan.spec.label}: {how}{needed - 1} and this machine has {num_devices} CUDA devices; "
                      f"map the plan's GPUs onto fewer with launch.cuda_devices (a repeated id shares a GPU), "
                      f"or run on a larger node or with launch.backend: ray")


def check_shared_memory(plan: Plan) -> None:
    """Refuse ranks that share a device (a repeated ``launch.cuda_devices`` id) when their memory does not fit it.

    Each rank may fill ``$.engine.memory_utilization`` of its device, so k ranks on one device need
    k times that to be at most 1.

    Raises:
        LaunchError: a device whose ranks would take more than all of it.
    """
    on_device: dict[int, list[str]] = defaultdict(list)
    for (instance, dp_rank), ids in plan_devices(plan).items():
        for tp_rank, device in enumerate(ids):
            on_device[device].append(f"{instance} rank {dp_rank * len(ids) + tp_rank}")
    utilization = plan.spec.engine.memory_utilization
    for device, ranks in sorted(on_device.items()):
        if len(ranks) * utilization > 1.0 + 1e-9:
            raise LaunchError(f"launch.cuda_devices puts {len(ranks)} ranks on device {device} ({', '.join(ranks)}), "
                              f"each allowed engine.memory_utilization {utilization:g} of it; set "
                              f"engine.memory_utilization to at most {1 / len(ranks):.2f}")


def visible_devices_value(ids: tuple[int, ...], launcher_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a unit on the launcher's devices ``ids``.

    Args:
        ids: device ids as the launcher counts them.
        launcher_visible: the launcher's own ``CUDA_VISIBLE_DEVICES`` (None: unset, every device):
            the unit gets those entries (indices, or ``GPU-<uuid>``), since its ids count from them.
    Raises:
        LaunchError: an id beyond the launcher's ``CUDA_VISIBLE_DEVICES``.
    """
    if launcher_visible is None:
        return ",".join(str(i) for i in ids)
    entries = [e.strip() for e in launcher_visible.split(",") if e.strip()]
    beyond = [i for i in ids if i >= len(entries)]
    if beyond:
        raise LaunchError(f"device {beyond[0]} is not among the {len(entries)} this launcher's "
                          f"CUDA_VISIBLE_DEVICES={launcher_visible!r} shows; use ids below {len(entries)}")
    return ",".join(entries[i] for i in ids)


def unit_visible_devices(plan: Plan, launcher_visible: str | None) -> dict[tuple[str, int], str]:
    """``CUDA_VISIBLE_DEVICES`` of every unit of a `device: cuda` plan on the local backend.

    Args:
        plan: the deployment's plan.
        launcher_visible: the launcher's own ``CUDA_VISIBLE_DEVICES`` (None: unset).
    Returns:
        (instance name, dp rank) -> the value its process gets, e.g. "2,3" for a tp-2 unit.
    Raises:
        LaunchError: see `plan_devices` and `visible_devices_value`.
    """
    return {unit: visible_devices_value(ids, launcher_visible) for unit, ids in plan_devices(plan).items()}


def require_cuda(unit: str, num_devices: int) -> None:
    """The unit's first CUDA call: check that its ranks' devices are there, before anything is built.

    Args:
        unit: the unit's name, for the message.
        num_devices: the devices its tp ranks take (its tp).
    Raises:
        UnitCannotRun: no CUDA at all, or fewer devices visible than ``num_devices``.
    """
    import torch

    visible = os.environ.get(VISIBLE_DEVICES_ENV, "unset")
    if not torch.cuda.is_available():
        raise UnitCannotRun(f"unit {unit}: no CUDA device (torch.cuda.is_available() is False; "
                            f"{VISIBLE_DEVICES_ENV}={visible}; torch {torch.__version__}): {TINY_HINT}")
    count = torch.cuda.device_count()
    if count < num_devices:
        raise UnitCannotRun(f"unit {unit}: its {num_devices} tp ranks need {num_devices} CUDA devices and it sees "
                            f"{count} ({VISIBLE_DEVICES_ENV}={visible}); check launch.cuda_devices, or {TINY_HINT}")
