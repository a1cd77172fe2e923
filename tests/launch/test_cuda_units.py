"""`device: cuda` units (issue 37 item 1): each unit's devices from the plan, and the path a GPU node
takes run on the CPU up to the first CUDA call, where a unit without CUDA says so in one line and
the launch leaves nothing behind. The `gpu` test runs the tiny P/D spec on one GPU against the CPU."""

from __future__ import annotations

import os
import re
import time

import attrs
import pytest
import yaml

from disaggsdk.errors import SpecError
from disaggsdk.launch.base import LaunchError, UnitCannotRun
from disaggsdk.launch.cuda_devices import (
    check_device_count,
    check_shared_memory,
    plan_devices,
    unit_visible_devices,
    visible_devices_value,
)
from disaggsdk.plan import make_plan
from disaggsdk.spec import load_spec, spec_from_dict, spec_problems, spec_to_dict
from tests.conftest import ROOT
from tests.declared_skips import gpu_present, no_gpu
from tests.launch._helpers import live_descendants

NO_CUDA = re.compile(r"unit (prefill-0|decode-0): no CUDA device \(torch\.cuda\.is_available\(\) is False; "
                     r"CUDA_VISIBLE_DEVICES=(\d)\b.*: run on a GPU node, or add --tiny")


def cuda_spec(**launch):
    """specs/tiny_pd.yaml on H100s: what the tiny P/D deployment is on a GPU node (float32, as on the CPU)."""
    data = yaml.safe_load((ROOT / "specs" / "tiny_pd.yaml").read_text())
    data["device"] = "cuda"
    data["hardware"] = {**data["hardware"], "gpu": "h100"}
    del data["hardware"]["cpu_memory_gb"]
    data["engine"] = {**data["engine"], "dtype": "float32", "num_pages": 256}
    data["launch"] = launch
    return spec_from_dict(data)


def r1_plan(**changes):
    spec = load_spec(ROOT / "specs" / "r1_dp.yaml")  # prefill tp 8 on node 0, decode dp 8 on node 1
    return make_plan(attrs.evolve(spec, **changes))


# each unit's devices, from the plan


def test_a_unit_gets_its_ranks_gpus_in_tp_order_and_nodes_sit_side_by_side():
    plan = r1_plan()
    devices = plan_devices(plan)
    assert devices[("prefill-0", 0)] == tuple(range(8))  # tp 8: rank r on device r, so cuda:r inside
    assert [devices[("decode-0", d)] for d in range(8)] == [(8 + d,) for d in range(8)]  # node 1: devices 8..15
    visible = unit_visible_devices(plan, None)
    assert visible[("prefill-0", 0)] == "0,1,2,3,4,5,6,7" and visible[("decode-0", 3)] == "11"


def test_cuda_devices_maps_the_plans_gpus_and_a_repeated_id_shares_one():
    plan = make_plan(cuda_spec(cuda_devices=[0, 0]))  # gpus_per_node 2: both instances on node 0
    assert plan_devices(plan) == {("prefill-0", 0): (0,), ("decode-0", 0): (0,)}
    one_gpu = make_plan(attrs.evolve(plan.spec, hardware=attrs.evolve(plan.spec.hardware, gpus_per_node=1)))
    assert [(r.node, r.gpu) for i in one_gpu.instances for r in i.ranks] == [(0, 0), (1, 0)]
    assert unit_visible_devices(one_gpu, None) == {("prefill-0", 0): "0", ("decode-0", 0): "0"}
    short = make_plan(attrs.evolve(plan.spec, launch=attrs.evolve(plan.spec.launch, cuda_devices=(3,))))
    with pytest.raises(LaunchError, match=r"lists 1 devices and the plan has 2 GPUs \(1 nodes x 2\)"):
        plan_devices(short)


def test_ids_count_the_launchers_own_visible_devices():
    assert visible_devices_value((0, 1), None) == "0,1"
    assert visible_devices_value((1, 0), "4,6") == "6,4"
    assert visible_devices_value((0,), "GPU-1a2b, GPU-3c4d") == "GPU-1a2b"
    with pytest.raises(LaunchError, match=r"device 2 is not among the 2 .*CUDA_VISIBLE_DEVICES='4,6'"):
        visible_devices_value((2,), "4,6")


def test_too_few_devices_is_refused_with_the_counts():
    check_device_count(r1_plan(), 16)
    with pytest.raises(LaunchError, match=r"r1-dp: the plan places its 16 ranks on GPUs 0\.\.15 and this machine "
                                          r"has 8 CUDA devices; map the plan's GPUs onto fewer with "
                                          r"launch\.cuda_devices"):
        check_device_count(r1_plan(), 8)


def test_ranks_sharing_a_gpu_must_fit_its_memory_together():
    spec = cuda_spec(cuda_devices=[0, 0])
    with pytest.raises(LaunchError, match=r"puts 2 ranks on device 0 \(prefill-0 rank 0, decode-0 rank 0\), each "
                                          r"allowed engine.memory_utilization 0.9 of it; set "
                                          r"engine.memory_utilization to at most 0.50"):
        check_shared_memory(make_plan(spec))
    check_shared_memory(make_plan(attrs.evolve(spec, engine=attrs.evolve(spec.engine, memory_utilization=0.45))))
    check_shared_memory(make_plan(cuda_spec()))  # one GPU each: 0.9 is fine


def test_cuda_devices_is_for_cuda_on_the_local_backend():
    data = spec_to_dict(cuda_spec(cuda_devices=[0, 0]))
    assert spec_problems(spec_from_dict(data)) == []
    ray = spec_from_dict({**data, "launch": {"backend": "ray", "cuda_devices": [0, 0]}})
    assert any(p.startswith("$.launch.cuda_devices: Ray gives each unit") for p in spec_problems(ray))
    cpu = load_spec(ROOT / "specs" / "tiny_pd.yaml")
    cpu = attrs.evolve(cpu, launch=attrs.evolve(cpu.launch, cuda_devices=(0,)))
    assert any("this spec runs on device: cpu" in p for p in spec_problems(cpu))
    with pytest.raises(SpecError, match=r"\$\.launch\.cuda_devices: must list device ids"):
        spec_from_dict({**data, "launch": {"cuda_devices": [-1]}})


# on a machine without CUDA: launched up to the first CUDA call

needs_no_cuda = pytest.mark.skipif(
    pytest.importorskip("torch").cuda.is_available(), reason=gpu_present("checks what a machine without CUDA says"))


def _socket_fds() -> int:
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}"))


def _fabric_shm_of(pids: set[int]) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.split(":")[0].isdigit() and int(n.split(":")[0]) in pids]


@needs_no_cuda
def test_a_cuda_unit_without_cuda_says_so_before_loading_and_leaves_nothing(monkeypatch):
    from disaggsdk.launch.launcher.supervisor import start_local_runtime
    from disaggsdk.launch.launcher.units import ProcessLauncher

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pids: set[int] = set()

    class Recording(ProcessLauncher):  # the real launcher; it only remembers its units' pids
        def spawn(self, args):
            handle = super().spawn(args)
            pids.add(handle.process.pid)
            return handle

    before, sockets, progress = live_descendants(), _socket_fds(), []
    with pytest.raises(UnitCannotRun) as info:
        start_local_runtime(cuda_spec(), launcher=Recording(), on_progress=progress.append, on_event=progress.append)
    message = str(info.value)
    assert "\n" not in message and (match := NO_CUDA.search(message)), message
    # the plan's devices reached the unit: prefill-0 on GPU 0, decode-0 on GPU 1 (gpus_per_node 2)
    assert match.group(2) == {"prefill-0": "0", "decode-0": "1"}[match.group(1)]
    assert len(pids) == 2 and not any("loading" in line for line in progress), progress  # nothing was built
    deadline = time.monotonic() + 10  # reaped by close(); the loop only waits out a slow /proc
    while live_descendants() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not live_descendants() - before, "a unit outlived the failed launch"
    assert not _fabric_shm_of(pids), "shared memory left behind"
    assert _socket_fds() <= sockets, "a unit channel left open"


@needs_no_cuda
def test_the_cli_says_it_in_one_line_exit_2_and_leaves_no_process(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump(spec_to_dict(cuda_spec())))
    logs = tmp_path / "logs"
    p = run_cli("launch", str(path), "--port", "0", "--no-live", "--log-dir", str(logs))
    errors = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, p.stderr
    assert len(errors) == 1 and errors[0].startswith("error: unit ") and NO_CUDA.search(errors[0]), p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    holders = []
    for pid in filter(str.isdigit, os.listdir("/proc")):  # a process still holding a unit's log is a leftover
        try:
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        holders += [pid for target in fds if target.startswith(str(logs))]
    assert not holders, f"processes {holders} outlived the launch"
    assert NO_CUDA.search((logs / "prefill-0.log").read_text())  # the unit's log says the same, no trace
    assert "Traceback" not in (logs / "prefill-0.log").read_text()


def test_tiny_drops_the_cuda_device_map():
    from disaggsdk.launch.tiny import tiny_spec

    small = tiny_spec(cuda_spec(cuda_devices=[0, 0]))
    assert small.launch.cuda_devices == () and spec_problems(small) == []


# on a GPU: the same deployment on CUDA gives the CPU's greedy tokens


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason=no_gpu("needs a CUDA device"))
def test_tiny_pd_on_one_gpu_gives_the_cpu_greedy_tokens(monkeypatch):
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.launch.tiny import tiny_spec
    from tests.launch._helpers import serve_and_generate

    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")  # float32 matmuls as on the CPU, for exact tokens
    spec = cuda_spec(cuda_devices=[0, 0])  # prefill and decode on device 0, as tools/gpu_check.sh runs them
    spec = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=1),
                        engine=attrs.evolve(spec.engine, memory_utilization=0.45))
    prompts = [[7, 8, 9, 10, 11], list(range(40, 90)), [256, 5, 6]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    _, on_gpu, stats = serve_and_generate(spec, prompts, params)
    _, on_cpu, _ = serve_and_generate(tiny_spec(spec), prompts, params)
    assert on_gpu == on_cpu
    assert sum(s.counters.transfer_bytes for s in stats.values()) > 0  # the KV crossed from the prefill unit to decode


@pytest.mark.slow  # a Ray cluster of its own; the local launcher's case runs by default above
@needs_no_cuda
def test_ray_grants_each_unit_its_gpus_and_the_unit_says_it_has_no_cuda():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from disaggsdk.launch.launcher.supervisor import start_ray_runtime

    small = 80 << 20  # object store bytes per node: nothing big goes through it
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "object_store_memory": small})
    for _ in range(2):  # two nodes of one logical GPU each: Ray hands them out as on a GPU node
        cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=small)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    try:
        spec = cuda_spec(backend="ray")
        spec = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=1))  # one unit a node
        with pytest.raises(UnitCannotRun) as info:
            start_ray_runtime(spec, max_restarts=0, on_event=lambda _l: None, on_progress=lambda _l: None)
        assert (match := NO_CUDA.search(str(info.value))), info.value
        assert match.group(2) == "0"  # Ray's CUDA_VISIBLE_DEVICES: the one GPU of the unit's node
        assert not [pg for pg in ray.util.placement_group_table().values()
                    if pg["name"].startswith("disaggsdk-") and pg["state"] != "REMOVED"]
    finally:
        ray.shutdown()
        cluster.shutdown()
