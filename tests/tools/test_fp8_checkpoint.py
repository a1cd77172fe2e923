"""The FP8 writer (`python -m tools.fp8_checkpoint`): the copy is in DeepSeek's / Qwen's HF block-FP8
format tensor by tensor, keeps the side files, shards as its source does, and refuses what it cannot copy."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from safetensors import safe_open  # noqa: E402

from disaggsdk.errors import ModelError  # noqa: E402
from disaggsdk.models.quantization import block_fp8_config  # noqa: E402
from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.hf_checkpoints import save_hf_checkpoint  # noqa: E402
from tools.fp8_checkpoint import write_fp8_checkpoint  # noqa: E402


def tensors_of(directory) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            out.update({name: handle.get_tensor(name) for name in handle.keys()})
    return out


@pytest.mark.parametrize("block_size", [128, 32])
def test_the_copy_is_in_the_hf_block_fp8_format(tmp_path, block_size):
    source = shipped_checkpoint("deepseek-r1-tiny")
    counts = write_fp8_checkpoint(source, tmp_path / "fp8", block_size)
    before, after = tensors_of(source), tensors_of(tmp_path / "fp8")
    scales = {n for n in after if n.endswith(".weight_scale_inv")}
    assert set(after) - scales == set(before) and counts["quantized"] == len(scales) > 0
    for name, tensor in before.items():
        scale = after.get(name + "_scale_inv")
        if scale is None:  # kept as it was: norms, embeddings, router, lm_head, MTP glue
            assert torch.equal(after[name], tensor), name
            continue
        rows, cols = tensor.shape
        assert after[name].dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert scale.shape == (math.ceil(rows / block_size), math.ceil(cols / block_size)), name
    # which tensors DeepSeek's release quantizes (kv_a_proj_with_mqa [80, 256]: a ragged row block)
    for quantized in ["model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.0.mlp.down_proj.weight",
                      "model.layers.1.mlp.experts.7.up_proj.weight", "model.layers.1.mlp.shared_experts.gate_proj.weight",
                      "model.layers.4.self_attn.o_proj.weight"]:
        assert quantized + "_scale_inv" in scales
    for kept in ["lm_head.weight", "model.embed_tokens.weight", "model.layers.1.mlp.gate.weight",
                 "model.layers.4.eh_proj.weight", "model.layers.4.shared_head.head.weight",
                 "model.layers.0.self_attn.kv_a_layernorm.weight"]:
        assert after[kept].dtype == torch.bfloat16 and kept + "_scale_inv" not in after
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"] == block_fp8_config(block_size)
    assert {k: v for k, v in config.items() if k != "quantization_config"} == json.loads((source / "config.json").read_text())
    for side in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        assert (tmp_path / "fp8" / side).read_bytes() == (source / side).read_bytes()
    assert not (tmp_path / "fp8" / "model.safetensors.index.json").exists()


def test_a_sharded_source_gives_shards_and_an_index_with_each_scale_beside_its_weight(tmp_path):
    save_hf_checkpoint("qwen3-coder-tiny", tmp_path / "src", max_shard_size="300KB")
    write_fp8_checkpoint(tmp_path / "src", tmp_path / "fp8")
    index = json.loads((tmp_path / "fp8" / "model.safetensors.index.json").read_text())
    source_map = json.loads((tmp_path / "src" / "model.safetensors.index.json").read_text())["weight_map"]
    weight_map = index["weight_map"]
    assert sorted(p.name for p in (tmp_path / "fp8").glob("*.safetensors")) == sorted(set(source_map.values()))
    for name, shard in source_map.items():
        assert weight_map[name] == shard
        if name + "_scale_inv" in weight_map:
            assert weight_map[name + "_scale_inv"] == shard
    tensors = tensors_of(tmp_path / "fp8")
    assert set(weight_map) == set(tensors)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())


def test_what_cannot_be_copied_is_refused(tmp_path):
    write_fp8_checkpoint(shipped_checkpoint("qwen3-coder-tiny"), tmp_path / "fp8")
    with pytest.raises(ModelError, match="quantized already"):
        write_fp8_checkpoint(tmp_path / "fp8", tmp_path / "again")
    with pytest.raises(ModelError, match="is not empty"):
        write_fp8_checkpoint(shipped_checkpoint("qwen3-coder-tiny"), tmp_path / "fp8")
    with pytest.raises(ModelError, match="has no config.json"):
        write_fp8_checkpoint(tmp_path / "nothing", tmp_path / "out")


def test_the_command_line_writes_a_copy_of_a_catalog_name(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.fp8_checkpoint", "qwen3-coder-tiny", str(tmp_path / "fp8"),
                           "--block-size", "64"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "block fp8 (64x64)" in proc.stdout
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [64, 64]


@pytest.mark.parametrize("name", ["deepseek-r1-tiny", "qwen3-coder-tiny"])
def test_the_copy_holds_the_tensors_the_memory_plan_counts(tmp_path, name):
    # the plan never opens a checkpoint: it derives names, shapes and FP8 dtypes from config.json
    # (models.checkpoint_tensors); the writer's real directory must hold exactly those
    from disaggsdk.models import resolve_model
    from disaggsdk.models.checkpoint_tensors import FP8_DTYPE, checkpoint_tensors

    write_fp8_checkpoint(shipped_checkpoint(name), tmp_path / "fp8")
    written = tensors_of(tmp_path / "fp8")
    planned = {t.name: t for t in checkpoint_tensors(resolve_model(str(tmp_path / "fp8")))}
    assert set(planned) == set(written)
    for tensor_name, t in planned.items():
        assert tuple(written[tensor_name].shape) == t.shape, tensor_name
        # FP8 weights and their scales; the rest keep the source's dtype (the tiny models store DeepSeek's
        # router bias in bfloat16 where R1 stores float32, which the inventory assumes)
        if t.dtype == FP8_DTYPE or t.scale_of is not None or written[tensor_name].dtype == torch.float8_e4m3fn:
            assert str(written[tensor_name].dtype).removeprefix("torch.") == t.dtype, tensor_name
