"""The Ray runtime on a local cluster of logical nodes (Ray's `cluster_utils.Cluster`: a head
without resources, three nodes of 8 `disaggsdk_slot`s and one CPU each, no dashboard, small object
stores; the last test removes one). Prefill and decode land on different nodes, KV moves over libfabric's tcp provider, and
greedy tokens equal the engine's for a GQA and an MLA model; a cluster without room is a clear error
before any actor starts; a unit actor killed under load costs retries or clear errors, the unit
comes back in its bundle, and shutdown leaves no actor, placement group, process or shm file."""

from __future__ import annotations

import os
import time

import attrs
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.launch import LaunchError  # noqa: E402
from disaggsdk.launch.launcher.supervisor import start_ray_runtime  # noqa: E402
from disaggsdk.serve.routing.router import Router  # noqa: E402
from tests.launch._helpers import make_spec  # noqa: E402

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(30, 70)), list(range(100, 113))]
SLOTS = 8


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    small = 80 << 20  # object store bytes per node: nothing big goes through it
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                      "object_store_memory": small})
    for _ in range(3):
        c.add_node(num_cpus=1, resources={"disaggsdk_slot": SLOTS}, object_store_memory=small)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def two_node_spec(model: str, **kw):
    """One prefill and one decode instance, one rank a node: the plan puts them on nodes 0 and 1."""
    spec = make_spec(model, **kw)
    return attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=1),
                        transport=attrs.evolve(spec.transport, same_host_copy=False))  # KV over tcp


def tokens(events) -> list[int]:
    return [t for e in events for t in e.new_token_ids]


def our_processes(wait_s: float = 10.0) -> list[str]:
    """Unit processes and unit actors of this project still on the machine after ``wait_s`` (Ray
    ends a killed actor's worker process shortly after the actor is dead)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if entry.isdigit() and (b"ray_unit_host" in cmd or b"UnitHost" in cmd):
                found.append(f"{entry}: {cmd.replace(bytes(1), b' ')[:120].decode(errors='replace')}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def placement_groups_left() -> list[str]:
    return [pg["name"] for pg in ray.util.placement_group_table().values()
            if pg["name"].startswith("disaggsdk-") and pg["state"] != "REMOVED"]


@pytest.mark.parametrize("model", ["qwen3-tiny", "deepseek-r1-tiny"])
def test_prefill_and_decode_on_different_nodes_give_the_engines_tokens(cluster, model):
    want = [o.output_ids for o in LLMEngine(model, EngineConfig(compile=False)).generate(PROMPTS, GREEDY)]
    with Router(start_ray_runtime(two_node_spec(model), max_restarts=0, on_event=lambda _l: None)) as r:
        placement = r.runtime.placement()
        got = [tokens(ev) for ev in r.generate_batch(PROMPTS, GREEDY, timeout_s=120)]
        stats = r.unit_stats()
    assert got == want
    assert placement["prefill-0"].startswith("plan node 0") and placement["decode-0"].startswith("plan node 1")
    assert placement["prefill-0"].split("Ray node ")[1] != placement["decode-0"].split("Ray node ")[1]
    assert stats["prefill-0"].counters.transfer_bytes > 0 and stats["decode-0"].counters.prefilled_locally == 0
    assert not placement_groups_left() and not our_processes()


def test_a_cluster_without_room_fails_before_any_actor_starts(cluster):
    spec = two_node_spec("qwen3-tiny")
    spec = attrs.evolve(spec, decode=attrs.evolve(spec.decode, replicas=3))  # four one-rank nodes
    with pytest.raises(LaunchError, match=r"plan node 3 needs 1 disaggsdk_slot.*no unused node"):
        start_ray_runtime(spec, max_restarts=0, on_event=lambda _l: None)
    assert not placement_groups_left() and not our_processes()


def test_unit_actors_killed_under_load(cluster):
    shm_before = set(os.listdir("/dev/shm"))
    lines: list[str] = []
    with Router(start_ray_runtime(two_node_spec("qwen3-tiny", num_pages=256, budget=16), max_restarts=1,
                           on_event=lines.append)) as r:
        prompts = [list(range(200 + i, 260 + i)) for i in range(6)]  # 60 tokens over a 16-token budget
        done: dict[int, list] = {}
        for i, p in enumerate(prompts):
            r.submit(f"load-{i}", p, GREEDY, lambda ev, i=i: done.setdefault(i, []).append(ev))
        deadline = time.monotonic() + 60
        while r.unit_stats()["prefill-0"].running == 0:
            assert time.monotonic() < deadline, "prefill-0 never started"
            time.sleep(0.01)
        r.runtime.kill_unit("prefill-0")  # its actor: the unit dies with it
        while sum(1 for evs in done.values() if evs[-1].finished) < len(prompts):
            assert time.monotonic() < deadline + 60, "requests hung after a prefill actor died"
            time.sleep(0.05)
        # every request completed (retried elsewhere or prefilled by the decode unit) or ended clearly
        for evs in done.values():
            assert evs[-1].finish_reason == "length" or (evs[-1].finish_reason == "error" and evs[-1].error)
        assert sum(evs[-1].finish_reason == "length" for evs in done.values()) >= 1
        assert any("prefill-0" in f and "died" in f for f in r.runtime.failures)
        deadline = time.monotonic() + 90
        while not (r.runtime.units["prefill-0"].healthy and r.runtime.units["prefill-0"].started):
            assert time.monotonic() < deadline, "prefill-0 was not restarted in its bundle"
            time.sleep(0.2)
        events = r.generate_batch([PROMPTS[0]], GREEDY, timeout_s=60)[0]
        assert events[-1].finish_reason == "length"
        deadline = time.monotonic() + 15
        while True:  # pages of the killed attempts come back once nothing can land in them
            stats = r.unit_stats()
            if all(s.num_free_pages == s.num_pages for s in stats.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert all(s.num_free_pages == s.num_pages for s in stats.values())
    assert any("restarted" in line for line in lines)
    assert not placement_groups_left() and not our_processes()
    assert set(os.listdir("/dev/shm")) <= shm_before


def _launch_cli(address: str, spec_path: str, *extra: str):
    """`disaggsdk launch SPEC --backend ray --address ADDRESS`; returns the process, its start-up
    lines and the server's URL once it says it is ready."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "disaggsdk.cli.main", "launch", spec_path, "--backend", "ray",
                             "--address", address, "--port", "0", "--no-live", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("ready in"):
            return proc, lines, "http" + line.split("http", 1)[1].split("/v1")[0]
    proc.wait(30)
    raise AssertionError("launch exited before it was ready:\n" + "".join(lines))


def _stop_cli(proc) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _serve_and_check(cluster, spec_path: str, *extra: str) -> None:
    import httpx
    import openai

    proc, lines, url = _launch_cli(cluster.address, spec_path, *extra)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=client.models.list().data[0].id, prompt="def f(x):", max_tokens=8)
        assert answer.choices[0].finish_reason in ("length", "stop")
        health = httpx.get(f"{url}/health", timeout=30).json()
    finally:
        _stop_cli(proc)
    placed = [line for line in lines if line.startswith("placement: ")]
    assert placed and len(placed) == len(health["placement"]) and health["status"] == "ok"
    for line in placed:
        name, where = line.removeprefix("placement: ").strip().split(" -> ")
        assert health["placement"][name] == where
    assert not placement_groups_left() and not our_processes()


def test_cli_launch_on_ray_serves_the_openai_client_and_shows_placement(cluster):
    _serve_and_check(cluster, os.path.join(os.path.dirname(__file__), "..", "..", "specs", "tiny_local.yaml"))


def test_requests_move_and_units_change_role_across_nodes(cluster):
    """Three units on three Ray nodes: a decoding request moves to the decode unit of another node with
    its KV (tcp), and a decode unit turns prefill and back, with every request's tokens unchanged."""
    from disaggsdk.serve.moves.rebalance import rebalance

    long = SamplingParams(max_tokens=100, ignore_eos=True)
    want = [o.output_ids for o in LLMEngine("qwen3-tiny", EngineConfig(compile=False)).generate(PROMPTS, long)]
    spec = two_node_spec("qwen3-tiny", decode_replicas=2, num_pages=256)
    with Router(start_ray_runtime(spec, max_restarts=0, on_event=lambda _l: None)) as r:
        placement = r.runtime.placement()
        assert len({placement[u].split("Ray node ")[1] for u in ("prefill-0", "decode-0", "decode-1")}) == 3
        done: dict[int, list] = {}
        for i, p in enumerate(PROMPTS):
            r.submit(f"mv-{i}", p, long, lambda ev, i=i: done.setdefault(i, []).append(ev))
        deadline = time.monotonic() + 60
        while len(done) < len(PROMPTS):
            assert time.monotonic() < deadline, "no first tokens"
            time.sleep(0.01)
        source = r.unit_of("mv-0")
        assert source is not None
        outcome = r.move("mv-0", "decode-1" if source == "decode-0" else "decode-0").result(60)
        assert outcome.moved and outcome.num_bytes > 0, outcome
        report = rebalance(r, prefill=2, decode=1)
        assert report.done, report
        while sum(1 for evs in done.values() if evs[-1].finished) < len(PROMPTS):
            assert time.monotonic() < deadline + 60, "requests hung across the moves"
            time.sleep(0.05)
        assert [tokens(done[i]) for i in range(len(PROMPTS))] == want
        after = r.generate_batch(PROMPTS, long, timeout_s=120)  # prefilled by both prefill units now
        assert [tokens(ev) for ev in after] == want
        assert rebalance(r, prefill=1, decode=2).done
        assert [tokens(ev) for ev in r.generate_batch(PROMPTS, long, timeout_s=120)] == want
    assert not placement_groups_left() and not our_processes()


@pytest.mark.slow
def test_r1_dp_tiny_on_two_logical_nodes(cluster):
    """The acceptance line: specs/r1_dp.yaml --tiny (prefill tp 8 on one node, 8 dp decode units on
    the other) served to the openai client, placement in the start-up lines and /health."""
    _serve_and_check(cluster, os.path.join(os.path.dirname(__file__), "..", "..", "specs", "r1_dp.yaml"), "--tiny")


def test_a_remote_units_log_tail_is_read_on_its_node(cluster, tmp_path):
    """A unit on another machine writes its log there: its failure report reads the tail through its
    actor (the driver cannot open the path)."""
    from disaggsdk.launch.launcher.ray_launcher import RayUnitProcess
    from disaggsdk.launch.launcher.ray_unit_host import unit_host_actor

    log = tmp_path / "unit.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    actor = unit_host_actor().remote()
    try:
        process = RayUnitProcess(actor, pid=12345, same_host=False, log_path=str(log))
        assert process.pid == -1  # no pid names a remote process here
        tail = process.log_tail(str(log))
        assert tail.startswith("line 70") and tail.endswith("line 99\n")
    finally:
        ray.kill(actor, no_restart=True)


def test_a_lost_node_takes_its_units_down_and_the_rest_keep_serving(cluster):
    """Last in this module: it removes a node. decode-1's node goes; decode-0 keeps serving, and
    decode-1's restarts, which Ray would place elsewhere, are refused (not the plan's node)."""
    spec = two_node_spec("qwen3-tiny")
    spec = attrs.evolve(spec, decode=attrs.evolve(spec.decode, replicas=2))  # prefill, decode-0, decode-1
    lines: list[str] = []
    with Router(start_ray_runtime(spec, max_restarts=1, on_event=lines.append)) as r:
        lost = r.runtime.launcher.unit_nodes["decode-1"].node_id
        node = next(n for n in cluster.worker_nodes if n.node_id == lost)
        cluster.remove_node(node)
        deadline = time.monotonic() + 150  # a restart may wait for Ray to move the bundle, then be refused
        while r.runtime.is_healthy("decode-1") or "decode-1" in r.runtime._restarting:
            assert time.monotonic() < deadline, "decode-1 was not taken down with its node"
            time.sleep(0.2)
        events = r.generate_batch(PROMPTS, GREEDY, timeout_s=60)
        assert all(ev[-1].finish_reason == "length" and ev[-1].instance == "decode-0" for ev in events)
    # refused at once when Ray already knows the node died, else once the start fails or lands elsewhere
    refusals = [line for line in lines if line.startswith("restart 1 of unit decode-1 failed")]
    assert refusals and ("is gone" in refusals[0] or "as the plan says" in refusals[0]), lines
    assert any(line.startswith("unit decode-1 stays down") for line in lines), lines
    assert not placement_groups_left() and not our_processes()
