"""The fluent builder: immutable steps, equality with the YAML spec, validation at the end."""

from pathlib import Path

import pytest

from disaggsdk import Cluster, SpecError, load_spec
from disaggsdk.spec import Role

SPECS = Path(__file__).resolve().parents[2] / "specs"


def test_builder_equals_the_qwen3_coder_spec_file():
    built = (Cluster().prefill(tp=8).decoders(3, tp=8).model("qwen3-coder")
             .engine(dtype="bfloat16", memory_utilization=0.95))
    assert built.spec == load_spec(SPECS / "qwen3_coder.yaml")


def test_every_call_returns_a_new_value():
    base = Cluster().model("deepseek-r1")
    wider = base.decoders(3, tp=8)
    assert base.draft.decode == Role()
    assert wider.draft.decode == Role(replicas=3, tp=8)
    assert base.prefill(tp=8) == base.prefill(tp=8)  # re-running a cell gives an equal value


def test_all_sections_are_reachable():
    c = (Cluster().model("qwen3-coder-tiny").named("t").device("cpu").seed(7)
         .hardware(gpu="cpu", gpus_per_node=4, nics_per_node=1, nic_gbps=100)
         .kv(layout="NHD", page_size=32, dtype="float32").transport("tcp").serve(port=9000)
         .prefills(2, tp=2).decode(dp=2).speculative("ngram", 3))
    s = c.spec
    assert (s.speculative.method, s.speculative.num_tokens) == ("ngram", 3)
    assert (s.name, s.seed, s.kv.layout, s.kv.page_size, s.transport.provider, s.serve.port) == ("t", 7, "NHD", 32, "tcp", 9000)
    assert (s.prefill.replicas, s.prefill.tp, s.decode.dp) == (2, 2, 2)


def test_yaml_round_trip_through_the_builder(tmp_path):
    c = Cluster().prefill(tp=8).decoders(3, tp=4).model("qwen3-coder")
    (tmp_path / "s.yaml").write_text(c.to_yaml())
    assert Cluster.from_yaml(tmp_path / "s.yaml") == c


def test_bad_values_fail_at_the_call_and_cross_rules_at_spec():
    with pytest.raises(ValueError, match="tp: must be a positive number"):
        Cluster().prefill(tp=0)
    draft = Cluster().decoders(3, tp=5)  # fine until the model's heads are known
    with pytest.raises(SpecError, match=r"\$\.decode\.tp: tp=5 does not divide the 96 query heads"):
        _ = draft.spec  # a property: building the spec applies the cross rules


def test_html_repr_shows_the_yaml():
    assert "qwen3-coder" in Cluster()._repr_html_()


def test_on_ray_sets_the_launch_section_and_round_trips():
    from disaggsdk.spec import parse_spec_yaml, spec_to_yaml

    c = Cluster().model("qwen3-tiny").device("cpu").hardware(gpu="cpu").on_ray("auto")
    assert (c.spec.launch.backend, c.spec.launch.address) == ("ray", "auto")
    assert parse_spec_yaml(spec_to_yaml(c.spec)).launch == c.spec.launch
    assert Cluster().spec.launch.backend == "local"


def test_device_cpu_brings_cpu_hardware_along():
    """Issue 38: `.device("cpu")` alone gives a spec that validates (it failed on hardware.gpu h200)."""
    spec = Cluster().prefill(tp=1).decoders(2).model("qwen3-coder-tiny").device("cpu").spec
    assert (spec.device, spec.hardware.gpu) == ("cpu", "cpu")
    back = Cluster().model("qwen3-coder-tiny").device("cpu").device("cuda").spec
    assert (back.device, back.hardware.gpu) == ("cuda", "h200")
    h100 = Cluster().model("qwen3-coder-tiny").hardware(gpu="h100").device("cuda").spec
    assert h100.hardware.gpu == "h100"  # a GPU kind already chosen stays


def test_a_cross_rule_error_from_the_builder_names_the_spec_path_and_the_call():
    draft = Cluster().prefill(tp=1).decoders(2).model("qwen3-coder-tiny").device("cpu").hardware(gpu="h200")
    with pytest.raises(SpecError) as caught:
        _ = draft.spec
    (problem,) = caught.value.problems
    assert problem.startswith("$.hardware.gpu: 'h200' with device 'cpu'")  # the YAML path stays
    assert "Cluster.hardware(gpu=...) or Cluster.device(...)" in problem
    with pytest.raises(SpecError, match=r"\$\.decode\.tp: tp=5 .*Cluster\.decoders\(n, tp=\.\.\.\)"):
        _ = Cluster().decoders(3, tp=5).spec


def test_a_bad_value_names_the_outermost_call_that_gave_it():
    with pytest.raises(ValueError, match=r"^Cluster\.decoders\(3, tp=0\): Role\.tp: must be a positive number"):
        Cluster().decoders(3, tp=0)
    with pytest.raises(ValueError, match=r"^Cluster\.hardware\(gpu='x'\): Hardware\.gpu: 'x' is not valid"):
        Cluster().hardware(gpu="x")


def test_builder_call_maps_spec_paths_to_methods():
    from disaggsdk.face.cluster import builder_call

    assert builder_call("$.decode.replicas") == "Cluster.decoders(n)"
    assert builder_call("$.prefill.tp") == "Cluster.prefill(tp=...)"
    assert builder_call("$.serve.port") == "Cluster.serve(port=...)"
    assert builder_call("$.launch.address") == "Cluster.on_ray(address=...)"
    assert builder_call("$.name") == "Cluster.named(...)"
    assert builder_call("$.serve.max_queued_requests") is None  # YAML only: no hint rather than a wrong one


def test_a_memory_problem_found_at_launch_names_the_calls_too():
    draft = Cluster().model("qwen3-coder-tiny").device("cpu").prefill(tp=1).decoders(1).engine(num_pages=10**7)
    with pytest.raises(SpecError) as caught:
        draft.launch(port=0)  # refused by the plan before any process starts
    problem = caught.value.problems[0]
    assert problem.startswith("$.engine.num_pages: prefill rank 0's 10000000 pages need")
    # the keys the message names ("raise `$.prefill.tp`") get their calls as well
    assert problem.endswith("(in Python: Cluster.engine(num_pages=...) or Cluster.hardware(cpu_memory_gb=...) "
                            "or Cluster.prefill(tp=...))")
