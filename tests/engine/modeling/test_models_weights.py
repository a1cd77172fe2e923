"""Loading weights: sharded checkpoints, clear errors for broken directories, seeded random init,
and the DeepSeek MTP layer's weights."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_oracle import ContiguousAttention, make_batch
from safetensors.torch import load_file, save_file

from disaggsdk.engine.modeling import build_model
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.errors import ModelError
from tests.hf_checkpoints import save_hf_checkpoint

TP1 = TensorParallel()


@pytest.fixture(scope="module")
def coder_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("coder")
    save_hf_checkpoint("qwen3-coder-tiny", directory)
    return directory


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    return dst


def rewrite_tensors(directory, edit):
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def params(model):
    return {k: v for k, v in model.state_dict().items()}


def logits_of(model, prompt=(3, 1, 4, 1, 5, 9, 2, 6)):
    batch = make_batch([list(prompt)], [0])
    attn = ContiguousAttention()
    attn.plan(batch)
    with torch.no_grad():
        return model.compute_logits(model(batch, attn))


def test_sharded_index_loads_the_same_weights(tmp_path, coder_dir):
    save_hf_checkpoint("qwen3-coder-tiny", tmp_path / "sharded", max_shard_size="300KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 2
    sharded = params(build_model(str(tmp_path / "sharded"), TP1))
    single = params(build_model(str(coder_dir), TP1))
    assert sharded.keys() == single.keys()
    for k in single:
        assert torch.equal(sharded[k], single[k]), k


def test_missing_tensor_is_named(tmp_path, coder_dir):
    d = copy_dir(coder_dir, tmp_path / "m")
    rewrite_tensors(d, lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(ModelError, match=r"lacks tensor 'model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight'"):
        build_model(str(d), TP1)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path, coder_dir):
    d = copy_dir(coder_dir, tmp_path / "s")
    rewrite_tensors(d, lambda t: t.__setitem__("model.layers.1.self_attn.k_proj.weight", torch.zeros(128, 256)))
    with pytest.raises(ModelError) as err:
        build_model(str(d), TP1)
    msg = str(err.value)
    assert "'model.layers.1.self_attn.k_proj.weight'" in msg and "[128, 256]" in msg and "[256, 256]" in msg


@pytest.mark.parametrize(
    "edit, field",
    [
        ({"architectures": ["LlamaForCausalLM"]}, "'architectures'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "'rope_scaling.type'"),
        ({"attention_bias": True}, "'attention_bias'"),
        ({"hidden_act": "gelu"}, "'hidden_act' is 'gelu'"),
        # block fp8 loads (tests/engine/test_fp8_checkpoint.py); other quantizations are named
        ({"quantization_config": {"quant_method": "awq"}}, "quant_method is 'awq'; only block-scaled 'fp8'"),
    ],
)
def test_unsupported_config_fields_are_named(tmp_path, coder_dir, edit, field):
    d = copy_dir(coder_dir, tmp_path / "c")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(ModelError, match=field):
        build_model(str(d), TP1)


def test_missing_files_are_explained(tmp_path, coder_dir):
    d = copy_dir(coder_dir, tmp_path / "f")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no model.safetensors"):
        build_model(str(d), TP1)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "gone.safetensors"}}))
    with pytest.raises(ModelError, match="'gone.safetensors'"):
        build_model(str(d), TP1)


def test_models_that_cannot_be_built_here(tmp_path):
    with pytest.raises(ModelError, match="full-size catalog model"):
        build_model("deepseek-r1", TP1)
    with pytest.raises(ModelError, match="num_attention_heads=8"):
        build_model("qwen3-tiny", TensorParallel(rank=0, size=3))
    with pytest.raises(ModelError, match="did you mean 'qwen3-tiny'"):
        build_model("qwen3-tiyn", TP1)


def test_random_init_is_seeded_and_runs_in_bfloat16():
    a, b = (build_model("qwen3-tiny", TP1, seed=0, load_format="dummy") for _ in range(2))
    c = build_model("qwen3-tiny", TP1, seed=1, load_format="dummy")
    pa, pb, pc = params(a), params(b), params(c)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa["lm_head.weight"], pc["lm_head.weight"])
    half = build_model("qwen3-tiny", TP1, dtype="bfloat16", load_format="dummy")
    assert half.lm_head.weight.dtype == torch.bfloat16
    out = logits_of(half)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    # bfloat16 is a rounding of the float32 model, not another model
    assert (out.argmax(-1) == logits_of(a).argmax(-1)).float().mean() > 0.5


def test_deepseek_mtp_weights_are_loaded_and_kept(tmp_path):
    source = build_model("deepseek-r1-tiny", TP1, seed=3)
    assert source.mtp is not None and len(source.mtp) == 1
    slots = list(source.weight_slots())
    mtp_names = [s.name for s in slots if s.optional_group == "mtp"]
    assert "model.layers.4.eh_proj.weight" in mtp_names and "model.layers.4.shared_head.head.weight" in mtp_names
    assert "model.layers.4.mlp.experts.7.down_proj.weight" in mtp_names
    from disaggsdk.models import catalog_config

    tensors = {s.name: s.target.contiguous().clone() for s in slots}
    d = tmp_path / "ds"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(catalog_config("deepseek-r1-tiny")))
    save_file(tensors, str(d / "model.safetensors"))
    loaded = build_model(str(d), TP1)
    assert loaded.mtp is not None
    assert torch.equal(loaded.mtp[0].eh_proj.weight, source.mtp[0].eh_proj.weight)
    assert torch.equal(loaded.mtp[0].block.mlp.experts.w13, source.mtp[0].block.mlp.experts.w13)
    torch.testing.assert_close(logits_of(loaded), logits_of(source), atol=0, rtol=0)

    tensors.pop("model.layers.4.hnorm.weight")
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ModelError, match=r"mtp weights but lacks tensor 'model\.layers\.4\.hnorm\.weight'"):
        build_model(str(d), TP1)
