"""`$.kv.tiers`: sizes and the store address checked field by field, the tiers refused without prefix
caching or on tp > 1 units, and a unit's resolved settings (`engine.tier_settings`)."""

import os

import attrs
import pytest

from disaggsdk.engine.tier_settings import TierSettings
from disaggsdk.errors import SpecError
from disaggsdk.spec import KV, EngineSettings, Hardware, Role, Spec, spec_problems
from disaggsdk.spec.kv import KVTiers
from disaggsdk.spec.yaml_io import parse_spec_yaml


def tiny(**tiers) -> Spec:
    return Spec(model="qwen3-coder-tiny", device="cpu", hardware=Hardware(gpu="cpu"), prefill=Role(tp=1),
                decode=Role(tp=1), kv=KV(tiers=KVTiers(**tiers)))


def test_tiers_are_off_by_default_and_on_with_any_tier():
    assert not Spec().kv.tiers.enabled
    assert KVTiers(host_gb=1).enabled and KVTiers(disk_gb=1).enabled and KVTiers(store="10.0.0.5:6379").enabled


@pytest.mark.parametrize("field,value,words", [
    ("host_gb", -1.0, "must be a size in GB"), ("disk_gb", float("nan"), "must be a size in GB"),
    ("store", "redis", "must be off, launch or a Redis/Valkey address host:port"),
    ("store", "host:99999", "host:port"), ("write_policy", "lazy", "use one of write_through, on_eviction")])
def test_bad_values_name_the_field_and_the_fix(field, value, words):
    with pytest.raises(ValueError, match=words):
        KVTiers(**{field: value})


def test_yaml_errors_carry_the_path():
    with pytest.raises(SpecError, match=r"\$\.kv\.tiers\.store"):
        parse_spec_yaml("model: qwen3-coder-tiny\nkv:\n  tiers:\n    store: nowhere\n")


def test_tiers_need_prefix_caching_and_tp_1_units():
    assert spec_problems(tiny(host_gb=1)) == []
    no_cache = attrs.evolve(tiny(host_gb=1), engine=EngineSettings(prefix_caching=False))
    (problem,) = spec_problems(no_cache)
    assert problem.startswith("$.kv.tiers: the tiers keep prefix-cache pages; set $.engine.prefix_caching: true")
    (problem,) = spec_problems(Spec(model="qwen3-coder", prefill=Role(tp=8), decode=Role(tp=8),
                                    kv=KV(tiers=KVTiers(disk_gb=10))))
    assert "tp=1 units only for now (prefill tp=8, decode tp=8)" in problem


def test_a_units_settings_split_the_nodes_host_tier_and_keep_a_directory_per_unit(tmp_path):
    spec = tiny(host_gb=1.0, disk_gb=2.0, disk_path=str(tmp_path), store="127.0.0.1:6390", write_policy="write_through")
    settings = TierSettings.from_spec(spec, "decode-0", units_on_node=4)
    assert settings is not None
    assert settings.host_bytes == 250_000_000 and settings.disk_bytes == 2_000_000_000
    assert settings.disk_dir == os.path.join(str(tmp_path), spec.name or "deployment", "decode-0")
    assert settings.store_address == "127.0.0.1:6390" and settings.write_policy == "write_through"
    assert "qwen3-coder-tiny" in settings.model_identity
    assert TierSettings.from_spec(tiny(), "decode-0", 1) is None
    with pytest.raises(ValueError, match="resolved to the started store's address"):
        TierSettings.from_spec(tiny(store="launch"), "decode-0", 1)
