"""Spec files: every shipped spec loads, validates and round-trips; bad files fail clearly."""

import re
from pathlib import Path

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.spec import load_spec, parse_spec_yaml, save_spec, spec_to_yaml

SPECS = sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.yaml"))


def test_the_four_reference_specs_are_shipped():
    assert {p.stem for p in SPECS} >= {"tiny_local", "qwen3_coder", "r1_tp", "r1_dp"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_loads_and_round_trips_unchanged(path, tmp_path):
    spec = load_spec(path)
    assert parse_spec_yaml(spec_to_yaml(spec)) == spec
    save_spec(spec, tmp_path / "again.yaml")
    assert load_spec(tmp_path / "again.yaml") == spec


def test_tiny_local_is_the_embedded_cpu_default():
    spec = load_spec(SPECS[0].parent / "tiny_local.yaml")
    assert (spec.model, spec.device, spec.transport.provider) == ("qwen3-coder-tiny", "cpu", "shm")
    assert (spec.prefill.replicas, spec.decode.replicas) == (1, 2)


def test_r1_dp_decodes_with_eight_data_parallel_ranks():
    spec = load_spec(SPECS[0].parent / "r1_dp.yaml")
    assert (spec.model, spec.prefill.tp, spec.decode.tp, spec.decode.dp) == ("deepseek-r1", 8, 1, 8)


def test_syntax_error_names_file_line_and_column():
    with pytest.raises(SpecError, match=r"^f\.yaml:4:5: YAML syntax error: mapping values are not allowed here"):
        parse_spec_yaml("model: x\nprefill:\n tp: 1\n  dp: 2\n", source="f.yaml")


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing here\n")
    with pytest.raises(SpecError, match="the spec is empty; write at least `model: "):
        load_spec(tmp_path / "empty.yaml")
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "missing.yaml")


def test_rule_and_field_errors_name_the_file_before_the_yaml_path(tmp_path):
    (tmp_path / "x.yaml").write_text("model: deepseek-r1\ndecode: {tp: 3}\nkv: {layout: HDN}\n")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "x.yaml")
    assert info.value.problems == [f"{tmp_path / 'x.yaml'}: $.kv.layout: 'HDN' is not valid; use one of HND, NHD"]
    (tmp_path / "x.yaml").write_text("model: deepseek-r1\ndecode: {tp: 3}\n")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "x.yaml")
    (problem,) = info.value.problems
    assert problem.startswith(f"{tmp_path / 'x.yaml'}: $.decode.tp: tp=3 does not divide the 128 query heads")
    with pytest.raises(SpecError, match=r"^specs/x\.yaml: \$\.decode\.tp: tp=3 "):
        parse_spec_yaml("model: deepseek-r1\ndecode: {tp: 3}\n", source="specs/x.yaml")


def test_the_empty_spec_hint_is_a_spec_that_runs_on_this_cpu():
    with pytest.raises(SpecError) as info:
        parse_spec_yaml("", source="empty.yaml")
    (message,) = info.value.problems
    suggested = "\n".join(re.findall(r"`([^`]+)`", message))  # the lines, one per line, as it says
    spec = parse_spec_yaml(suggested)
    assert (spec.device, spec.hardware.gpu, spec.transport.provider) == ("cpu", "cpu", "shm")
    assert spec.model.endswith("-tiny")
    # one process per rank: the suggestion must fit the 2 cores of the development machine
    ranks = sum(r.replicas * r.ranks_per_instance for r in (spec.prefill, spec.decode))
    assert ranks <= spec.hardware.gpus_per_node == 2
