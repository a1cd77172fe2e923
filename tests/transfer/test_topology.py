"""Topology discovery on a fake sysfs tree (GPU node with RDMA NICs) and on this machine."""

from __future__ import annotations

import os

from disaggsdk.transfer.topology import discover_topology, parse_cpu_list


def _device(root, pci_path, numa, vendor=None, cls=None):
    dev = root / "devices" / pci_path
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(f"{numa}\n")
    if vendor:
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "class").write_text(cls + "\n")
    return dev


def _link(link, target):
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)


def make_gpu_node(root):
    """Two PCIe switches, each with a GPU and a ConnectX NIC; NUMA 0 and 1; plus eth0 and lo."""
    for sw, numa in (("pci0000:00/0000:00:01.0", 0), ("pci0000:80/0000:80:01.0", 1)):
        bus = "1b" if numa == 0 else "9c"
        gpu = _device(root, f"{sw}/0000:{bus}:00.0", numa, "0x10de", "0x030200")
        nic = _device(root, f"{sw}/0000:{bus}:01.0", numa)
        _link(root / "bus/pci/devices" / gpu.name, gpu)
        _link(root / "bus/pci/devices" / nic.name, nic)
        _link(root / f"class/infiniband/mlx5_{numa}/device", nic)
        node = root / f"devices/system/node/node{numa}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text("0-3,8-11\n" if numa == 0 else "4-7,12-15\n")
    eth = _device(root, "pci0000:00/0000:00:03.0", 0)
    _link(root / "class/net/eth0/device", eth)
    (root / "class/net/lo").mkdir(parents=True)


def test_gpu_node(tmp_path):
    make_gpu_node(tmp_path)
    topo = discover_topology(str(tmp_path))
    assert [n.name for n in topo.nics] == ["mlx5_0", "mlx5_1", "eth0", "lo"]
    assert [n.name for n in topo.transfer_nics] == ["mlx5_0", "mlx5_1"]
    assert topo.nics[0].provider == "verbs;ofi_rxm" and topo.nics[0].numa_node == 0
    assert [g.index for g in topo.gpus] == [0, 1] and topo.gpus[1].numa_node == 1
    assert topo.nics[0].nearest_gpu_ids == (0,) and topo.nics[1].nearest_gpu_ids == (1,)
    assert topo.nic_for_gpu(1).name == "mlx5_1"
    assert topo.numa_nodes[1].cpu_ids == (4, 5, 6, 7, 12, 13, 14, 15)


def test_machine_without_rdma_gets_loopback(tmp_path):
    (tmp_path / "class/net/lo").mkdir(parents=True)
    topo = discover_topology(str(tmp_path))
    assert [n.name for n in topo.transfer_nics] == ["lo"]
    assert topo.transfer_nics[0].provider == "tcp;ofi_rxm"
    assert topo.nic_for_gpu(0).name == "lo" and topo.gpus == ()


def test_this_machine():
    topo = discover_topology()
    assert topo.transfer_nics and topo.numa_nodes
    assert sum(len(n.cpu_ids) for n in topo.numa_nodes) >= 1


def test_parse_cpu_list():
    assert parse_cpu_list("0-2,5,7-8\n") == (0, 1, 2, 5, 7, 8)
    assert parse_cpu_list("") == ()
