"""One config path (issue 34): every default is declared once, in the spec, and each layer's
settings are built from a spec in one place (`EngineConfig.from_spec`; the simulator reads the spec)."""

import inspect

import attrs
import pytest

from disaggsdk.face.cluster import Cluster
from disaggsdk.spec import EngineSettings, Hardware, Spec, spec_from_dict
from disaggsdk.spec.engine_settings import BARE_NUM_PAGES

# the EngineConfig settings a spec sets, and where in the spec
SPEC_SETTINGS = {"layout": "kv.layout", "page_size": "kv.page_size", "num_pages": "engine.num_pages",
                 "max_num_batched_tokens": "engine.max_num_batched_tokens", "max_num_seqs": "engine.max_num_seqs",
                 "dtype": "engine.dtype", "seed": "seed", "load_format": "engine.load_format",
                 "compile": "engine.compile", "prefix_caching": "engine.prefix_caching",
                 "max_model_len": "engine.max_model_len"}


def _at(spec: Spec, path: str) -> object:
    value: object = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_a_bare_engine_runs_with_the_specs_defaults():
    """An EngineConfig built without a spec has the settings a launched unit of the default spec gets."""
    pytest.importorskip("torch")
    from disaggsdk.engine.config import EngineConfig

    # the default spec's model (480B on one GPU) has no memory left for KV: pages are set to compare the rest
    fitted = spec_from_dict({"engine": {"num_pages": BARE_NUM_PAGES}})
    bare, launched = EngineConfig(), EngineConfig.from_spec(fitted, tp=1, role="mixed")
    for name, path in SPEC_SETTINGS.items():
        expected = BARE_NUM_PAGES if name == "num_pages" else _at(Spec(), path)
        assert getattr(bare, name) == getattr(launched, name) == expected, name
    assert bare.max_num_seqs == EngineSettings().max_num_seqs == 64


def test_a_units_pool_is_the_memory_plans_unless_engine_num_pages_is_set():
    pytest.importorskip("torch")
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.plan import make_plan
    from disaggsdk.plan.memory import num_pages_per_rank

    spec = spec_from_dict({"model": "qwen3-coder-tiny", "device": "cpu", "hardware": {"gpu": "cpu"},
                           "decode": {"tp": 2}})
    pages = {role: EngineConfig.from_spec(spec, tp=r.tp, role=role).num_pages for role, r in spec.roles.items()}
    plan = make_plan(spec)
    assert pages == {"prefill": plan.memory[0].ranks[0].num_pages, "decode": plan.memory[1].ranks[0].num_pages}
    assert pages["decode"] > pages["prefill"]  # tp 2 ranks hold half the heads: twice the tokens
    assert pages == {role: num_pages_per_rank(spec, role) for role in spec.roles}
    mixed = EngineConfig.from_spec(spec, tp=2, role="mixed", instance_role="decode")
    assert mixed.num_pages == pages["decode"]
    explicit = attrs.evolve(spec, engine=attrs.evolve(spec.engine, num_pages=77))
    assert EngineConfig.from_spec(explicit, tp=2, role="decode").num_pages == 77


def test_every_engine_setting_comes_from_the_spec():
    pytest.importorskip("torch")
    from disaggsdk.engine.config import EngineConfig

    spec = spec_from_dict({"kv": {"layout": "NHD", "page_size": 32}, "seed": 3,
                           "engine": {"num_pages": 96, "max_num_batched_tokens": 64, "max_num_seqs": 5,
                                      "dtype": "bfloat16", "load_format": "dummy", "compile": False,
                                      "prefix_caching": False, "max_model_len": 2048}})
    config = EngineConfig.from_spec(spec, tp=1, role="decode")
    for name, path in SPEC_SETTINGS.items():
        assert getattr(config, name) == _at(spec, path), name
    fitted = spec_from_dict({"engine": {"num_pages": 64}})
    on_gpu = EngineConfig.from_spec(fitted, tp=1, role="prefill")
    assert (on_gpu.dtype, on_gpu.weight_dtype) == ("auto", "bfloat16")  # vLLM's --dtype auto
    on_cpu = EngineConfig.from_spec(spec_from_dict({"model": "qwen3-tiny", "device": "cpu", "hardware": {"gpu": "cpu"}}),
                                    tp=1, role="prefill")
    assert on_cpu.weight_dtype == "float32" == EngineConfig().weight_dtype  # transformers' tokens exactly


def test_the_builder_takes_a_sections_own_fields():
    """`Cluster.hardware` (and `kv`, `transfer`) take their section's fields, in its order; None keeps one."""
    fields = [f.name for f in attrs.fields(Hardware)]
    assert list(inspect.signature(Cluster.hardware).parameters)[1:] == fields
    assert list(inspect.signature(Cluster().hardware).parameters) == fields
    positional = Cluster().hardware("cpu", 4).draft.hardware
    assert (positional.gpu, positional.gpus_per_node) == ("cpu", 4)
    kept = Cluster().hardware(gpu="cpu").hardware(gpus_per_node=2, nic_gbps=None).draft.hardware
    assert kept == Hardware(gpu="cpu", gpus_per_node=2)
    assert Cluster().transfer(deadline_s=5.0).draft.transfer.deadline_s == 5.0


@pytest.mark.parametrize("command", [["serve", "--model", "qwen3-coder-tiny"], ["generate", "--model", "qwen3-coder-tiny"]])
def test_the_engine_flags_of_the_cli_default_to_the_specs_keys(command):
    """`serve` and `generate --model` run an engine without a spec: their flags' defaults are the spec's."""
    from disaggsdk.cli.main import build_parser

    args = build_parser().parse_args(command)
    flags = {"page_size": "kv.page_size", "num_pages": "engine.num_pages", "dtype": "engine.dtype",
             "max_num_batched_tokens": "engine.max_num_batched_tokens"}
    if command[0] == "serve":
        flags["max_num_seqs"] = "engine.max_num_seqs"
        flags["max_model_len"] = "engine.max_model_len"
    expected = {flag: BARE_NUM_PAGES if flag == "num_pages" else _at(Spec(), path) for flag, path in flags.items()}
    assert {flag: getattr(args, flag) for flag in flags} == expected
