"""The `transfer` and `engine` sections: defaults, YAML round trip, errors naming their path."""

from __future__ import annotations

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.spec import parse_spec_yaml, spec_from_dict, spec_to_yaml


def test_defaults_and_round_trip():
    spec = spec_from_dict({"model": "qwen3-coder-tiny", "device": "cpu", "hardware": {"gpu": "cpu"},
                           "transfer": {"streaming": False, "deadline_s": 5},
                           "engine": {"num_pages": 64, "max_num_batched_tokens": 32}})
    assert (spec.transfer.streaming, spec.transfer.deadline_s) == (False, 5.0)
    assert (spec.engine.num_pages, spec.engine.max_num_batched_tokens, spec.engine.max_num_seqs) == (64, 32, 64)
    assert parse_spec_yaml(spec_to_yaml(spec)) == spec
    assert spec_from_dict({}).transfer.streaming is True


def test_same_host_copy_is_on_by_default_and_can_be_turned_off():
    from disaggsdk import Cluster

    assert spec_from_dict({}).transport.same_host_copy is True
    off = spec_from_dict({"transport": {"provider": "shm", "same_host_copy": False}})
    assert off.transport.same_host_copy is False and parse_spec_yaml(spec_to_yaml(off)) == off
    built = Cluster().transport("shm", same_host_copy=False).draft.transport
    assert built == off.transport


@pytest.mark.parametrize("data,path", [
    ({"transfer": {"streaming": 1}}, "$.transfer.streaming"),
    ({"transport": {"same_host_copy": "yes"}}, "$.transport.same_host_copy"),
    ({"transfer": {"deadline_s": 0}}, "$.transfer.deadline_s"),
    ({"engine": {"num_pages": 0}}, "$.engine.num_pages"),
    ({"engine": {"max_num_seq": 4}}, "$.engine"),
])
def test_bad_values_name_their_path(data, path):
    with pytest.raises(SpecError, match=path.replace("$", r"\$").replace(".", r"\.")):
        spec_from_dict(data)
