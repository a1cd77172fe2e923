"""fp8 KV scales: read from a checkpoint under vLLM's names (1.0 where absent), refused when
malformed, and the conversions to and from fp8 pages."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from disaggsdk.engine.kv_scales import FP8_MAX, KVScales, from_cache, read_kv_scales, to_cache  # noqa: E402
from disaggsdk.errors import ModelError  # noqa: E402
from disaggsdk.models.shipped import checkpoint_directory  # noqa: E402


def checkpoint_with(tmp_path, model: str, extra: dict[str, torch.Tensor]):
    """A copy of ``model``'s shipped checkpoint with ``extra`` tensors in a second shard (indexed)."""
    src = checkpoint_directory(model)
    if src is None or not (src / "model.safetensors").is_file():
        pytest.skip(f"{model}'s checkpoint is not installed")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "model.safetensors").rename(tmp_path / "model-00001.safetensors")
    safetensors_torch.save_file(extra, str(tmp_path / "model-00002.safetensors"))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model-00001.safetensors"), framework="pt") as h:
        weight_map = {name: "model-00001.safetensors" for name in h.keys()}
    weight_map |= {name: "model-00002.safetensors" for name in extra}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def test_gqa_scales_come_from_k_scale_and_v_scale_under_each_name_vllm_reads(tmp_path):
    extra = {
        "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
        "model.layers.0.self_attn.v_scale": torch.tensor(2.0),
        "model.layers.1.self_attn.k_proj.k_scale": torch.tensor([0.25]),  # ModelOpt's names
        "model.layers.1.self_attn.v_proj.v_scale": torch.tensor([4.0]),
    }
    directory = checkpoint_with(tmp_path, "qwen3-coder-tiny", extra)
    scales = read_kv_scales(directory, 3, "gqa")
    assert scales.k == (0.5, 0.25, 1.0) and scales.v == (2.0, 4.0, 1.0)  # layer 2 has none: 1.0


def test_mla_reads_one_scale_for_its_latent_and_the_old_kv_scale_name(tmp_path):
    extra = {"model.layers.0.self_attn.k_scale": torch.tensor(0.5),
             "model.layers.1.self_attn.kv_scale": torch.tensor(0.125),  # deprecated single scale
             "model.layers.1.self_attn.v_scale": torch.tensor(9.0)}  # MLA has no V cache: unread
    directory = checkpoint_with(tmp_path, "deepseek-r1-tiny", extra)
    scales = read_kv_scales(directory, 2, "mla")
    assert scales.k == scales.v == (0.5, 0.125)


def test_no_checkpoint_means_unit_scales():
    assert read_kv_scales(None, 4, "gqa") == KVScales.unit(4) == KVScales((1.0,) * 4, (1.0,) * 4)


@pytest.mark.parametrize("bad", [torch.tensor(0.0), torch.tensor(-1.0), torch.tensor([1.0, 2.0]),
                                 torch.tensor(float("nan"))], ids=["zero", "negative", "two-values", "nan"])
def test_a_malformed_scale_tensor_is_refused_by_name(tmp_path, bad):
    directory = checkpoint_with(tmp_path, "qwen3-coder-tiny", {"model.layers.1.self_attn.v_scale": bad})
    with pytest.raises(ModelError, match=r"model\.layers\.1\.self_attn\.v_scale"):
        read_kv_scales(directory, 2, "gqa")


def test_scales_must_be_positive_and_as_many_for_k_as_for_v():
    with pytest.raises(ModelError, match="finite and > 0"):
        KVScales((1.0, 0.0), (1.0, 1.0))
    with pytest.raises(ModelError, match="2 k scales but 1 v scales"):
        KVScales((1.0, 1.0), (1.0,))


def test_to_cache_divides_saturates_and_from_cache_multiplies():
    fp8 = torch.float8_e4m3fn
    x = torch.tensor([1.0, -3.0, 1000.0, -1e9, 2.0**-12])
    stored = to_cache(x, fp8, 0.5)
    assert stored.dtype == fp8
    # /0.5 -> 2, -6, 2000 -> 448, -2e9 -> -448, 2^-11 -> 0 (below e4m3's smallest subnormal, 2^-9)
    assert stored.float().tolist() == [2.0, -6.0, FP8_MAX, -FP8_MAX, 0.0]
    assert from_cache(stored, torch.float32, 0.5).tolist() == [1.0, -3.0, 224.0, -224.0, 0.0]
    # other dtypes are a plain cast, the scale unread
    assert to_cache(x, torch.bfloat16, 0.5).float().tolist() == x.bfloat16().float().tolist()
    assert from_cache(x.bfloat16(), torch.float32, 0.5).tolist() == x.bfloat16().float().tolist()
