"""Node topology from sysfs: NICs (RDMA and Ethernet) with NUMA node and PCI path, the CPUs of
each NUMA node, NVIDIA GPUs, and which GPUs sit nearest each NIC.

Pure reads of files under `sysfs_root`, so tests point it at a fake tree. A machine without
RDMA NICs gets one loopback NIC served by `tcp;ofi_rxm` (and `shm` within the node).
"""

from __future__ import annotations

import os

import attrs

_NVIDIA_VENDOR = "0x10de"
_GPU_CLASSES = ("0x030000", "0x030200")  # VGA and 3D controllers


@attrs.frozen
class NumaNode:
    """A NUMA node and its CPUs."""

    node_id: int
    cpu_ids: tuple[int, ...]


@attrs.frozen
class Gpu:
    """An NVIDIA GPU; `index` follows PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)."""

    index: int
    pci_path: str  # resolved sysfs device path, e.g. /sys/devices/pci0000:00/.../0000:1b:00.0
    numa_node: int | None


@attrs.frozen
class Nic:
    """A network interface usable by the transport."""

    name: str  # "mlx5_0", "efa_0", "eth0", "lo"
    kind: str  # "rdma", "net" or "loopback"
    provider: str  # the libfabric provider to open on it
    numa_node: int | None
    pci_path: str | None
    nearest_gpu_ids: tuple[int, ...] = ()


@attrs.frozen
class Topology:
    """What `discover_topology` found."""

    nics: tuple[Nic, ...]
    numa_nodes: tuple[NumaNode, ...]
    gpus: tuple[Gpu, ...]

    @property
    def transfer_nics(self) -> tuple[Nic, ...]:
        """The RDMA NICs, or the loopback NIC where there are none."""
        rdma = tuple(n for n in self.nics if n.kind == "rdma")
        return rdma or tuple(n for n in self.nics if n.kind == "loopback")

    def nic_for_gpu(self, gpu_index: int) -> Nic:
        """The transfer NIC nearest a GPU (the first transfer NIC when none is marked nearest)."""
        nics = self.transfer_nics
        return next((n for n in nics if gpu_index in n.nearest_gpu_ids), nics[0])


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _numa(device_dir: str) -> int | None:
    value = _read(os.path.join(device_dir, "numa_node"))
    return int(value) if value not in (None, "", "-1") else None


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parses a sysfs CPU list such as "0-3,8,10-11"."""
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def _pci_distance(a: str, b: str) -> int:
    """Number of PCI path components not shared: 0 is the same device, small is close."""
    pa, pb = a.split("/"), b.split("/")
    common = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        common += 1
    return len(pa) + len(pb) - 2 * common


def _numa_nodes(root: str) -> tuple[NumaNode, ...]:
    base = os.path.join(root, "devices/system/node")
    nodes = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if name.startswith("node") and name[4:].isdigit():
            cpus = _read(os.path.join(base, name, "cpulist")) or ""
            nodes.append(NumaNode(int(name[4:]), parse_cpu_list(cpus)))
    return tuple(sorted(nodes, key=lambda n: n.node_id))


def _gpus(root: str) -> tuple[Gpu, ...]:
    base = os.path.join(root, "bus/pci/devices")
    found = []
    for bus_id in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        dev = os.path.join(base, bus_id)
        if _read(os.path.join(dev, "vendor")) == _NVIDIA_VENDOR and \
                _read(os.path.join(dev, "class")) in _GPU_CLASSES:
            found.append((os.path.realpath(dev), _numa(dev)))
    return tuple(Gpu(i, path, numa) for i, (path, numa) in enumerate(found))


def _nic(root: str, cls: str, name: str, kind: str, provider: str) -> Nic:
    device = os.path.join(root, "class", cls, name, "device")
    pci = os.path.realpath(device) if os.path.exists(device) else None
    return Nic(name, kind, provider, _numa(device) if pci else None, pci)


def _nearest(nic: Nic, gpus: tuple[Gpu, ...]) -> tuple[int, ...]:
    """GPUs closest by PCI path; NUMA node breaks ties and stands in without a PCI path."""
    if not gpus or nic.kind == "loopback":
        return ()
    if nic.pci_path is None:
        return tuple(g.index for g in gpus if g.numa_node == nic.numa_node)
    dist = {g.index: _pci_distance(nic.pci_path, g.pci_path) for g in gpus}
    best = min(dist.values())
    close = [g for g in gpus if dist[g.index] == best]
    same_numa = [g for g in close if g.numa_node == nic.numa_node]
    return tuple(g.index for g in (same_numa or close))


def discover_topology(sysfs_root: str = "/sys") -> Topology:
    """Reads the node's topology.

    Args:
        sysfs_root: where sysfs is mounted (a fake tree in tests).

    Returns:
        NICs (RDMA first, then physical Ethernet, then loopback), NUMA nodes and GPUs.
    """
    gpus = _gpus(sysfs_root)
    nics: list[Nic] = []
    ib = os.path.join(sysfs_root, "class/infiniband")
    for name in sorted(os.listdir(ib)) if os.path.isdir(ib) else []:
        provider = "efa" if name.startswith("efa") else "verbs;ofi_rxm"
        nics.append(_nic(sysfs_root, "infiniband", name, "rdma", provider))
    net = os.path.join(sysfs_root, "class/net")
    for name in sorted(os.listdir(net)) if os.path.isdir(net) else []:
        # only interfaces backed by a device: skips lo, bridges, veths
        if name != "lo" and os.path.exists(os.path.join(net, name, "device")):
            nics.append(_nic(sysfs_root, "net", name, "net", "tcp;ofi_rxm"))
    nics.append(Nic("lo", "loopback", "tcp;ofi_rxm", None, None))
    nics = [attrs.evolve(n, nearest_gpu_ids=_nearest(n, gpus)) for n in nics]
    return Topology(tuple(nics), _numa_nodes(sysfs_root), gpus)
