"""The generated spec reference and JSON Schema: in sync with the classes, documented, and strict."""

from pathlib import Path

import attrs
import jsonschema  # installed with nbformat (the `dev` extra)
import pytest
import yaml

from disaggsdk.errors import SpecError
from disaggsdk.spec import Spec, spec_from_dict, spec_to_dict
from disaggsdk.spec.field_checks import about, positive
from disaggsdk.spec.reference import (
    REGENERATE,
    check_name_of,
    generated_files,
    json_schema,
    main,
    render_markdown,
    rules_reading,
    spec_sections,
)
from disaggsdk.spec.rules import MODEL_KEYS, RULES

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
KEYS = [key for section in spec_sections() for key in section.keys]
MODELINE = "# yaml-language-server: $schema=../docs/spec.schema.json"


@pytest.fixture(scope="module")
def validator():
    schema = json_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


# in sync


@pytest.mark.parametrize("name", sorted(generated_files()))
def test_committed_docs_equal_what_the_generator_produces(name):
    committed = (ROOT / "docs" / name).read_text()
    assert committed == generated_files()[name], (
        f"docs/{name} is out of date with disaggsdk/spec/types.py or rules.py; "
        f"run `{REGENERATE}` from the repository root and commit the result"
    )


def test_a_new_field_changes_the_generated_files():
    @attrs.frozen
    class Grown(Spec):
        max_num_gpus: int = attrs.field(default=8, metadata=about("A key added later.", positive))

    markdown, schema = render_markdown(Grown), json_schema(Grown)
    assert "| `$.max_num_gpus` | integer | `8` | A key added later. | positive |" in markdown
    assert schema["properties"]["max_num_gpus"] == {
        "description": "A key added later.", "type": "integer", "default": 8, "exclusiveMinimum": 0,
    }


def test_write_puts_both_files_in_the_docs_dir(tmp_path, capsys):
    assert main(["--write", "--docs-dir", str(tmp_path)]) == 0
    for name, text in generated_files().items():
        assert (tmp_path / name).read_text() == text
    assert main(["--write", "--docs-dir", str(tmp_path / "missing")]) == 2
    assert "run from the repository root" in capsys.readouterr().err


# documented


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.path)
def test_every_field_has_a_doc(key):
    assert key.doc.strip(), f"{key.path}: give the field a doc with field_checks.about(...)"


def test_every_section_class_has_a_docstring():
    assert all(section.doc.strip() for section in spec_sections())


def test_every_key_a_rule_declares_is_a_spec_key():
    paths = {key.path for key in KEYS}
    for rule in RULES:
        assert set(rule.keys) <= paths, f"{rule.name} declares keys the spec does not have"
    assert set(MODEL_KEYS) <= paths


def test_checked_by_names_the_field_check_and_the_rules_that_read_the_key():
    by_path = {key.path: key for key in KEYS}
    tp = by_path["$.decode.tp"]
    assert check_name_of(tp) == "1..4096"
    assert rules_reading(tp) == ["deployment_is_plannable", "tp_divides_query_heads", "tp_splits_kv_heads",
                                 "instance_fits_nodes", "tiers_need_prefix_caching"]
    assert rules_reading(by_path["$.model"]) == ["resolve_model"]
    markdown = render_markdown()
    assert ("| `$.device` | one of `cpu`, `cuda` | `cuda` | Where the ranks run: `cuda` GPUs, or `cpu` "
            "processes (with `$.hardware.gpu: cpu`). | one of cpu, cuda; `device_matches_hardware`; "
            "`rdma_needs_gpus`; `verified_pages_are_host_memory`; `tcp_cannot_reach_gpu_memory`") in markdown
    for rule in RULES:
        assert f"| `{rule.name}` | {rule.summary} |" in markdown


# the schema


def _schema_defaults(prop: dict) -> object:
    """The defaults a schema property declares: a section's (nested sections too) as a dict."""
    if "properties" in prop:
        return {k: _schema_defaults(p) for k, p in prop["properties"].items()}
    return prop["default"]


def test_schema_defaults_are_the_class_defaults():
    schema, defaults = json_schema(), spec_to_dict(Spec())
    for name, value in defaults.items():
        assert _schema_defaults(schema["properties"][name]) == value, name


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_schema_accepts_every_shipped_spec(path, validator):
    text = path.read_text()
    assert text.startswith(MODELINE + "\n"), f"{path.name}: start it with {MODELINE!r} for editors"
    validator.validate(yaml.safe_load(text))


# (what is wrong, data): the loader and the schema must both refuse it.
BAD = [
    ("unknown top-level key", {"model": "qwen3-coder", "decod": {"tp": 8}}),
    ("unknown key in a section", {"kv": {"layuot": "HND"}}),
    ("bad enum value", {"kv": {"layout": "HDN"}}),
    ("bad device", {"device": "tpu"}),
    ("bad gpu kind", {"hardware": {"gpu": "a100"}}),
    ("zero tp", {"decode": {"tp": 0}}),
    ("string for an integer", {"decode": {"tp": "eight"}}),
    ("bool for an integer", {"prefill": {"replicas": True}}),
    ("port out of range", {"serve": {"port": 70000}}),
]


@pytest.mark.parametrize("data", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_schema_rejects_what_the_loader_rejects(data, validator):
    assert not validator.is_valid(data)
    with pytest.raises(SpecError):
        spec_from_dict(data)


def test_schema_allows_an_empty_section_as_the_loader_does(validator):
    data = {"model": "qwen3-coder", "prefill": None}
    assert validator.is_valid(data)
    assert spec_from_dict(data).prefill == Spec().prefill
