"""YAML data -> Spec: strict types, every problem reported at its path, suggestions for typos."""

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.spec import Spec, spec_from_dict, spec_to_dict


def problems_of(data) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    return info.value.problems


def test_defaults_are_the_qwen3_coder_h200_deployment():
    spec = spec_from_dict({})
    assert spec == Spec()
    assert (spec.model, spec.device, spec.hardware.gpu, spec.kv.layout) == ("qwen3-coder", "cuda", "h200", "HND")


def test_unknown_key_names_its_path_and_suggests_the_closest():
    assert problems_of({"decod": {"tp": 2}}) == ["$.decod: unknown key; did you mean 'decode'?"]
    assert problems_of({"prefill": {"rep": 2}}) == ["$.prefill.rep: unknown key; did you mean 'replicas'?"]


def test_unknown_key_without_a_close_match_lists_valid_keys():
    (problem,) = problems_of({"kv": {"zzz": 1}})
    assert problem.startswith("$.kv.zzz: unknown key; valid keys: layout, page_size, dtype")


def test_wrong_types_are_never_coerced():
    assert problems_of({"kv": {"page_size": 16.5}}) == ["$.kv.page_size: expected an integer, got 16.5 (float)"]
    assert problems_of({"seed": True}) == ["$.seed: expected an integer, got True (bool)"]
    assert problems_of({"decode": {"tp": "eight"}}) == ["$.decode.tp: expected an integer, got 'eight' (str)"]


def test_all_problems_are_reported_not_just_the_first():
    problems = problems_of({
        "decod": {}, "prefill": {"tp": 0, "dp": 0}, "kv": {"layout": "XYZ", "page_size": 12},
        "serve": {"port": 70000},
    })
    assert len(problems) == 6, problems
    joined = "\n".join(problems)
    for path in ("$.decod", "$.prefill.tp", "$.prefill.dp", "$.kv.layout", "$.kv.page_size", "$.serve.port"):
        assert path in joined


def test_value_messages_say_what_is_valid():
    (layout,) = problems_of({"kv": {"layout": "hnd"}})
    assert "use one of HND, NHD" in layout
    (page,) = problems_of({"kv": {"page_size": 12}})
    assert "power of two (e.g. 8 or 16)" in page


def test_a_section_must_be_a_mapping_and_may_be_empty():
    (problem,) = problems_of({"hardware": 3})
    assert problem.startswith("$.hardware: expected a mapping of gpu, gpus_per_node")
    assert spec_from_dict({"prefill": None}).prefill.tp == 1


def test_top_level_must_be_a_mapping():
    (problem,) = problems_of(["model", "x"])
    assert problem.startswith("$: a spec is a mapping")


def test_dict_round_trip_is_exact():
    spec = spec_from_dict({"name": "x", "decode": {"replicas": 3, "tp": 4}, "kv": {"layout": "NHD"}})
    assert spec_from_dict(spec_to_dict(spec)) == spec
    assert "name" not in spec_to_dict(Spec())
