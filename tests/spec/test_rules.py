"""Cross-field rules: tp against the model's heads, instance size against the node, device kind."""

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.spec import Hardware, Role, Spec, check_spec, spec_problems


def test_valid_specs_have_no_problems():
    assert spec_problems(Spec(prefill=Role(tp=8), decode=Role(replicas=3, tp=8))) == []
    assert spec_problems(Spec(model="deepseek-r1", decode=Role(tp=1, dp=8))) == []


def test_tp_must_divide_the_query_heads():
    (problem,) = spec_problems(Spec(model="deepseek-r1", decode=Role(tp=3)))
    assert problem.startswith("$.decode.tp: tp=3 does not divide the 128 query heads of deepseek-r1")
    assert "use one of 1, 2, 4, 8, 16, 32, 64, 128" in problem


def test_gqa_tp_must_divide_or_be_a_multiple_of_kv_heads():
    (problem,) = spec_problems(Spec(prefill=Role(tp=6)))
    assert problem.startswith("$.prefill.tp: tp=6 neither divides nor is a multiple of the 8 KV heads")
    assert spec_problems(Spec(prefill=Role(tp=16))) == []  # replicated heads, spans 2 nodes


def test_instance_must_fit_a_node_or_span_whole_nodes():
    (problem,) = spec_problems(Spec(model="deepseek-r1", decode=Role(tp=4, dp=3)))
    assert problem.startswith("$.decode: an instance of tp*dp = 4*3 = 12 ranks does not fit a node of 8")


def test_unknown_model_lists_the_catalog_and_suggests():
    (problem,) = spec_problems(Spec(model="qwen3-codr"))
    assert "$.model: unknown model 'qwen3-codr'; did you mean 'qwen3-coder'?" in problem
    assert "deepseek-r1-tiny" in problem


def test_device_and_hardware_must_agree():
    problems = spec_problems(Spec(model="qwen3-tiny", device="cpu"))
    assert problems == ["$.hardware.gpu: 'h200' with device 'cpu'; set $.hardware.gpu to 'cpu' "
                        "(a CPU rank is one process) or $.device to 'cuda'"]
    cpu = Hardware(gpu="cpu", gpus_per_node=4)
    assert spec_problems(Spec(model="qwen3-tiny", device="cpu", hardware=cpu)) == []


def test_check_spec_raises_with_every_problem():
    with pytest.raises(SpecError) as info:
        check_spec(Spec(prefill=Role(tp=5), decode=Role(tp=7)))
    assert len(info.value.problems) == 4


def test_construction_checks_single_values_immediately():
    with pytest.raises(ValueError, match=r"Role.tp: must be a positive number, got 0"):
        Role(tp=0)


def test_speculation_needs_an_mtp_layer_for_mtp_and_runs_at_any_tp():
    from disaggsdk.spec import Speculative

    one = Role(tp=1, dp=8)
    assert spec_problems(Spec(model="deepseek-r1", prefill=one, decode=one, speculative=Speculative("mtp", 2))) == []
    assert spec_problems(Spec(model="qwen3-coder", decode=one, speculative=Speculative("ngram", 4))) == []
    (problem,) = spec_problems(Spec(model="qwen3-coder", decode=one, speculative=Speculative("mtp")))
    assert problem.startswith("$.speculative.method: qwen3-coder has no MTP layer") and "use ngram" in problem
    assert spec_problems(Spec(model="deepseek-r1", prefill=Role(tp=8), decode=Role(tp=8),
                              speculative=Speculative("mtp"))) == []
    with pytest.raises(ValueError, match="num_tokens: must be in 1..4"):
        Speculative("ngram", 5)
    with pytest.raises(ValueError, match="'eagle' is not valid; use one of none, mtp, ngram"):
        Speculative("eagle")


def test_gpu_pools_over_tcp_need_host_staging_and_digests_need_host_memory():
    from disaggsdk.spec.kv import Transport

    tcp_direct = Transport(provider="tcp", kv_staging="direct")
    (problem,) = spec_problems(Spec(transport=tcp_direct))
    assert problem.startswith("$.transport.kv_staging: the tcp provider cannot register GPU memory")
    assert spec_problems(Spec(transport=Transport(provider="tcp"))) == []  # auto stages through host mirrors
    (problem,) = spec_problems(Spec(transport=Transport(provider="efa", verify_pages=True)))
    assert "($.transport.kv_staging: host)" in problem
    assert spec_problems(Spec(transport=Transport(provider="efa", verify_pages=True, kv_staging="host"))) == []
