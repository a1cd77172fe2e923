"""A disaggregated deployment across testbed nodes (issue 39 item 2): prefill in node 0, decode in
node 1, placed by Ray, KV over libfabric tcp through the shaped link.

The driver (`disaggsdk launch SPEC --backend ray`) and the openai client run inside node 0, the
only place that reaches the cluster. The greedy tokens equal the engine's; the prefill unit's own
counter of KV bytes written (``/metrics``) is covered by what node 1's link received, and the
decode unit's endpoint listened on the node's ``eth0``: the KV crossed the shaped link, not a
same-host path. Slow (a Ray cluster and two units across namespaces): `make test-all`; the default
run keeps two quick cases: two nodes are two hosts for the same-host path, and 4 MiB of pages
written between tcp endpoints in two nodes cross the link.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import attrs
import pytest

from disaggsdk.testbed import LinkSpec, RayOptions
from disaggsdk.testbed.ray_cluster import ray_env

PROMPT = list(range(40, 240))  # 200 tokens: 13 pages of 16 per layer
MAX_TOKENS = 8
READY_TIMEOUT_S = 240.0
SPEC_PATH = "/tmp/dsk-across-nodes.yaml"  # in node 0's own /tmp
LOG_DIR = "/tmp/dsk-across-nodes-logs"  # each node's own /tmp: a unit's log stays on its node

# run in a node: this process's same-host identity
HOST_ID = "from disaggsdk.transfer.same_host import host_id; print(host_id().hex())"
# run in node 0: the openai client against the front end, then /metrics and /health
CLIENT = """import json, sys, httpx, openai
url = sys.argv[1]
client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)
prompt = json.loads(sys.argv[2])
out = client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=int(sys.argv[3]),
                                temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
print(json.dumps({"token_ids": out.model_dump()["choices"][0]["token_ids"], "metrics": httpx.get(url + "/metrics").text,
                  "health": httpx.get(url + "/health").json()}))
"""


NUM_PAGES, PAGE_BYTES = 64, 1 << 16
# node 1: a region peers write into; prints its interface, endpoint address and descriptor, then
# the digest of what landed once every page's immediate arrived
TARGET = f"""import hashlib, sys
from disaggsdk.transfer import TransferEngine
from disaggsdk.transfer.interfaces import tcp_domain
with TransferEngine("tcp", tcp_domain(sys.argv[1])) as engine:
    buffer = bytearray({NUM_PAGES} * {PAGE_BYTES})
    region = engine.register(buffer)
    landed = engine.expect(7, {NUM_PAGES})
    print(engine.domain, engine.address.hex(), region.descriptor.to_bytes().hex(), flush=True)
    landed.result(timeout=60)
    print(hashlib.sha256(buffer).hexdigest(), flush=True)
    engine.deregister(region)
"""
# node 0: writes every page to node 1's region; prints its interface, the digest sent, its same-host writes
INITIATOR = f"""import hashlib, sys
from disaggsdk.transfer import RegionDescriptor, TransferEngine, WriteBatch
from disaggsdk.transfer.interfaces import tcp_domain
with TransferEngine("tcp", tcp_domain(sys.argv[1])) as engine:
    source = bytearray(range(256)) * ({NUM_PAGES} * {PAGE_BYTES} // 256)
    region = engine.register(source, remote_write=False)
    peer = engine.add_peer(bytes.fromhex(sys.argv[2]))
    dst = RegionDescriptor.from_bytes(bytes.fromhex(sys.argv[3]))
    pages = range({NUM_PAGES})
    engine.submit(peer, WriteBatch.pages(region, dst, pages, pages, {PAGE_BYTES}, 7)).result(timeout=60)
    print(engine.domain, hashlib.sha256(source).hexdigest(), engine.stats()["writes_direct"], flush=True)
    engine.deregister(region)
"""


def write_pages_across(n0, n1, timeout_s: float = 60.0) -> tuple[str, list[str], str]:
    """Node 0 writes NUM_PAGES pages into a region of node 1 over tcp endpoints (TARGET, INITIATOR).

    Returns:
        (node 1's endpoint interface, what INITIATOR printed: interface, digest sent, same-host
        writes, the digest of what landed in node 1)
    """
    target = n1.popen([sys.executable, "-c", TARGET, n1.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert target.stdout is not None
        domain, address, descriptor = target.stdout.readline().split()
        sent = n0.run([sys.executable, "-c", INITIATOR, n0.address, address, descriptor],
                      timeout_s=timeout_s).stdout.split()
        received = target.stdout.readline().strip()
        assert target.wait(30) == 0
    finally:
        if target.poll() is None:
            target.kill()
            target.wait(10)
    return domain, sent, received


def test_host_id_differs_between_nodes(testbed):
    """Two testbed nodes share the kernel (one boot id) but are not one host for a same-host path."""
    tb = testbed(nodes=2)
    ids = [node.run([sys.executable, "-c", HOST_ID]).stdout.strip() for node in tb.nodes]
    again = tb.node(0).run([sys.executable, "-c", HOST_ID]).stdout.strip()
    assert ids[0] != ids[1] and again == ids[0]  # another process in the same node: the same host
    assert len(ids[0]) == 32 and int(ids[0], 16) != 0


def test_kv_pages_cross_the_link_between_tcp_endpoints_on_the_node_interfaces(testbed):
    """The transport alone: an endpoint in each node, opened on the interface holding the node's
    address (eth0, not loopback); node 0 writes 4 MiB of pages into node 1's region through the link."""
    pytest.importorskip("disaggsdk.transfer._fabric")
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=1000))
    n0, n1 = tb.nodes
    before = n1.link_counters()
    domain, sent, received = write_pages_across(n0, n1)
    after = n1.link_counters()
    assert domain == n1.interface and sent[0] == n0.interface  # eth0 in each node, not lo
    assert received == sent[1]  # every byte landed
    assert sent[2] == "0"  # no same-host write
    assert after.rx_bytes - before.rx_bytes >= PAGE_BYTES * NUM_PAGES


def _metric(text: str, name: str, engine: str) -> float:
    found = re.search(rf'^{name}{{[^}}]*engine="{engine}"[^}}]*}} (\S+)$', text, re.M)
    assert found, f"no {name} for {engine} in /metrics"
    return float(found.group(1))


def _wait_ready(proc: subprocess.Popen[str], lines: list[str]) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"ready in .*(http://127\.0\.0\.1:\d+)/v1", line)
        if found:
            return found.group(1)
    raise AssertionError("the launch in node 0 did not get ready:\n" + "".join(lines))


@pytest.mark.slow
def test_prefill_and_decode_in_different_nodes_send_kv_over_the_link(testbed):
    pytest.importorskip("ray")
    pytest.importorskip("openai")
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.spec import spec_to_yaml
    from tests.launch._helpers import make_spec

    spec = make_spec("qwen3-tiny", provider="tcp", num_pages=128, budget=256, page_size=16)
    # one rank a plan node: prefill is plan node 0, decode plan node 1, pinned to testbed nodes 0 and 1
    spec = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=1))
    want = LLMEngine("qwen3-tiny", EngineConfig(compile=False)).generate(
        [PROMPT], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0].output_ids
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=1000),
                 ray=RayOptions(num_cpus=1, resources={"disaggsdk_slot": 1}, object_store_bytes=80 << 20))
    n0, n1 = tb.nodes
    env = {**ray_env(), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    n0.run(["sh", "-c", f"cat > {SPEC_PATH}"], input=spec_to_yaml(spec))
    # `exec` keeps the shell's pid, which it prints first: a SIGTERM to it inside node 0 stops the launch
    # (a signal to the nsenter outside would not reach it)
    launch = n0.popen(["sh", "-c", f'echo "$$"; exec "$0" -m disaggsdk.cli.main launch {SPEC_PATH} --backend ray '
                                   f"--address {tb.ray_address} --port 0 --no-live --max-restarts 0 "
                                   f"--log-dir {LOG_DIR}", sys.executable],
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    lines: list[str] = []
    try:
        assert launch.stdout is not None
        driver_pid = launch.stdout.readline().strip()
        url = _wait_ready(launch, lines)
        placement = [line for line in lines if line.startswith("placement:")]
        assert any("prefill-0 -> plan node 0" in p and f"({n0.address})" in p for p in placement), lines
        assert any("decode-0 -> plan node 1" in p and f"({n1.address})" in p for p in placement), lines
        before = n1.link_counters()
        done = n0.run([sys.executable, "-c", CLIENT, url, json.dumps(PROMPT), str(MAX_TOKENS)], env=env,
                      timeout_s=180)
        after = n1.link_counters()
        answer = json.loads(done.stdout)
        decode_log = n1.run(["cat", f"{LOG_DIR}/decode-0.log"]).stdout
        n0.run(["kill", "-TERM", driver_pid])
        lines += launch.stdout.readlines()  # to its end: the launch shut down and closed its output
        launch.wait(60)
    finally:
        if launch.poll() is None:
            launch.kill()  # the nsenter; the testbed fixture's `down` ends what runs in the nodes
            launch.wait(10)
    assert answer["token_ids"] == want
    kv_bytes = _metric(answer["metrics"], "disaggsdk_kv_transfer_bytes_total", "prefill-0")
    assert kv_bytes > 0
    assert _metric(answer["metrics"], "disaggsdk_requests_prefilled_locally_total", "decode-0") == 0
    # the KV went from node 0 to node 1 over node 1's link: it received at least those bytes
    assert after.rx_bytes - before.rx_bytes >= kv_bytes
    assert f"endpoint tcp;ofi_rxm on {n1.interface}" in decode_log, decode_log
    # ended by that SIGTERM after a clean shutdown: the CLI's status is 143 (terminated), which
    # nsenter, its parent outside the node, passes on as the signal's number or dies of, by version
    assert launch.returncode in (128 + signal.SIGTERM, signal.SIGTERM, -signal.SIGTERM), "".join(lines)
    assert "Traceback" not in "".join(lines)
