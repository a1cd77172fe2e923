"""The plan counts the KV tiers (`plan.kv_tiers`): each unit's share of its node's host tier, its disk tier
and the launched store, in bytes and pages, in the JSON and the memory tables; the router remembers the pages
a unit's own tiers keep."""

import attrs

from disaggsdk.plan import make_plan
from disaggsdk.plan.kv_tiers import unit_tiers, units_on_node
from disaggsdk.plan.memory import kv_bytes_per_token_rank
from disaggsdk.plan.render import memory_tables
from disaggsdk.serve.routing.unit_routing import UnitRouting
from disaggsdk.spec import KV, Hardware, Role, Spec
from disaggsdk.spec.kv import KVTiers


def spec(**tiers) -> Spec:
    return Spec(model="qwen3-coder-tiny", device="cpu", hardware=Hardware(gpu="cpu", gpus_per_node=2),
                prefill=Role(replicas=2, tp=1), decode=Role(tp=1), kv=KV(dtype="float32", tiers=KVTiers(**tiers)))


def test_each_unit_gets_its_share_of_its_nodes_host_tier_and_pages_of_its_page_bytes():
    plan = make_plan(spec(host_gb=0.4, disk_gb=2.0, store="launch", store_gb=1.0))
    assert units_on_node(plan, "prefill-0") == 2 and units_on_node(plan, "decode-0") == 1  # 2 ranks a node
    prefill, decode = unit_tiers(plan)
    page_bytes = 16 * kv_bytes_per_token_rank(plan.spec, plan.arch, 1)
    assert prefill.page_bytes == decode.page_bytes == page_bytes
    assert (prefill.host_bytes, decode.host_bytes) == (200_000_000, 400_000_000)
    assert prefill.pages(prefill.disk_bytes) == 2_000_000_000 // page_bytes
    assert prefill.store_bytes == 1_000_000_000
    assert prefill.private_pages == (200_000_000 // page_bytes) + (2_000_000_000 // page_bytes)
    assert plan.to_json()["kv"]["tiers"][1] == decode.to_json()  # type: ignore[index]
    assert decode.to_json()["host_pages"] == 400_000_000 // page_bytes
    titles = [title for title, _header, _rows in memory_tables(plan)]
    assert any(t.startswith("KV tiers per unit in GB (pages)") for t in titles)


def test_no_tiers_no_table_and_a_named_store_says_its_own_size():
    plan = make_plan(spec())
    assert unit_tiers(plan) == () and plan.to_json()["kv"]["tiers"] == []  # type: ignore[index]
    assert not any(t.startswith("KV tiers") for t, _h, _r in memory_tables(plan))
    assert unit_tiers(make_plan(spec(store="10.0.0.5:6379")))[0].store_bytes == 0


def test_the_router_remembers_the_pages_a_decode_units_pool_and_own_tiers_hold():
    base = spec()
    with_tiers = attrs.evolve(base, kv=attrs.evolve(base.kv, tiers=KVTiers(host_gb=0.4, disk_gb=2.0)))
    pool = UnitRouting.from_spec(base).policy.index.capacity_pages
    decode = unit_tiers(make_plan(with_tiers))[1]
    assert UnitRouting.from_spec(with_tiers).policy.index.capacity_pages == pool + decode.private_pages
