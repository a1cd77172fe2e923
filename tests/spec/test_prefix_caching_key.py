"""`engine.prefix_caching`: on by default (as vLLM's), off by YAML or the builder, and what a unit's
engine does with it (under MTP drafting, pages are keyed one token further)."""

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.face.cluster import Cluster
from disaggsdk.spec import spec_from_dict, spec_to_dict


def test_prefix_caching_defaults_on_and_round_trips():
    assert spec_from_dict({}).engine.prefix_caching is True
    spec = spec_from_dict({"engine": {"prefix_caching": False}})
    assert spec.engine.prefix_caching is False and spec_from_dict(spec_to_dict(spec)) == spec
    with pytest.raises(SpecError):
        spec_from_dict({"engine": {"prefix_caching": "sometimes"}})


def test_the_builder_sets_it_beside_the_engine_sizes():
    c = Cluster().engine(num_pages=512, prefix_caching=False)
    assert (c.draft.engine.num_pages, c.draft.engine.prefix_caching) == (512, False)
    assert Cluster().engine(num_pages=512).draft.engine.prefix_caching is True


def test_each_units_engine_follows_it_and_keys_pages_one_token_further_under_mtp():
    pytest.importorskip("torch")
    from disaggsdk.engine.config import EngineConfig, hash_lookahead

    on = spec_from_dict({"model": "deepseek-r1-tiny"})
    off = spec_from_dict({"model": "deepseek-r1-tiny", "engine": {"prefix_caching": False}})
    mtp = spec_from_dict({"model": "deepseek-r1-tiny", "speculative": {"method": "mtp", "num_tokens": 1}})
    assert EngineConfig.from_spec(on, tp=1, role="decode").prefix_caching
    assert not EngineConfig.from_spec(off, tp=1, role="prefill").prefix_caching
    assert hash_lookahead(EngineConfig.from_spec(on, tp=1, role="decode")) == 0
    for role in ("prefill", "decode"):  # both sides key MTP pages alike: decode looks up what prefill sent
        config = EngineConfig.from_spec(mtp, tp=1, role=role)
        assert config.prefix_caching and hash_lookahead(config) == 1


def test_max_local_prefill_tokens_defaults_off_is_checked_and_set_by_the_builder():
    assert spec_from_dict({}).transfer.max_local_prefill_tokens == 0  # every prompt to a prefill unit
    spec = spec_from_dict({"transfer": {"max_local_prefill_tokens": 256}})
    assert spec.transfer.max_local_prefill_tokens == 256 and spec_from_dict(spec_to_dict(spec)) == spec
    with pytest.raises(SpecError, match=r"transfer\.max_local_prefill_tokens.*0 or more"):
        spec_from_dict({"transfer": {"max_local_prefill_tokens": -1}})
    c = Cluster().transfer(max_local_prefill_tokens=128, deadline_s=5.0)
    assert (c.draft.transfer.max_local_prefill_tokens, c.draft.transfer.deadline_s, c.draft.transfer.streaming) == (
        128, 5.0, True)
