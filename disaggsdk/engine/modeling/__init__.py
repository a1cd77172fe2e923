"""Model implementations: a registry by `ModelArch.family` and a factory that imports lazily.

``build_model("qwen3-coder-tiny", tp)`` loads the trained tiny checkpoint that ships with the package
(`disaggsdk.models.shipped`), ``build_model(DIR, tp)`` a Hugging Face checkpoint directory, each rank
reading only its shard of every tensor; ``load_format="dummy"`` gives seeded random weights of the
same shapes instead (vLLM's name for it), for tests that need many or odd-shaped models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from disaggsdk.engine.modeling.base import CausalLM, KVGeometry, check_supported, check_tp, kv_geometry
from disaggsdk.errors import ModelError

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.modeling.layers.decoder import DecoderModel
    from disaggsdk.engine.parallel import TensorParallel

# family -> "module:class"; modules are imported only when a model of that family is built.
MODEL_CLASSES = {
    "qwen3": "disaggsdk.engine.modeling.qwen3:Qwen3ForCausalLM",
    "qwen3_moe": "disaggsdk.engine.modeling.qwen3_moe:Qwen3MoeForCausalLM",
    "deepseek_v3": "disaggsdk.engine.modeling.deepseek_v3:DeepseekV3ForCausalLM",
}

__all__ = ["CausalLM", "KVGeometry", "LOAD_FORMATS", "MODEL_CLASSES", "build_model", "kv_geometry", "model_class"]

# "auto": the checkpoint's weights (a tiny catalog name's shipped one); "dummy": seeded random ones
LOAD_FORMATS = ("auto", "dummy")


def model_class(family: str) -> type[DecoderModel]:
    """The implementation class of a model family.

    Raises:
        ModelError: no implementation for ``family``.
    """
    try:
        target = MODEL_CLASSES[family]
    except KeyError:
        raise ModelError(
            f"no engine implementation for model family {family!r}; supported: {sorted(MODEL_CLASSES)}"
        ) from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a torch dtype or its name ("float32", "bfloat16", "float16").

    Raises:
        ModelError: an unknown dtype name.
    """
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    try:
        return names[str(dtype)]
    except KeyError:
        raise ModelError(f"unknown model dtype {dtype!r}; use one of {sorted(names)}") from None


def build_model(model: str, tp: TensorParallel, dtype: torch.dtype | str = "float32",
                device: torch.device | str = "cpu", seed: int = 0, load_format: str = "auto") -> DecoderModel:
    """Build this rank's shard of a model, with weights.

    Args:
        model: a tiny catalog name (its shipped trained checkpoint) or a Hugging Face checkpoint
            directory (config.json + model.safetensors or model.safetensors.index.json).
        tp: this rank's tensor-parallel context.
        dtype: parameter dtype (torch dtype or name).
        device: where the parameters live.
        seed: seed of random weights; every rank draws the same full tensors and keeps its slice,
            so tp=1 and tp=2 build the same model.
        load_format: "auto" (the checkpoint's weights; random for a tiny catalog model whose
            checkpoint is not installed) or "dummy" (seeded random weights, the checkpoint unread).
    Returns:
        The model (a `CausalLM`, an ``nn.Module``) in eval mode, ``requires_grad`` off.
    Raises:
        ModelError: unknown model or load format, unsupported architecture or config field (e.g. a
            quantization other than block FP8), a model that cannot be split over
            ``tp.size``, a full-size catalog model without a checkpoint, or a checkpoint whose
            tensors are missing or mis-shaped (the message names the tensor).
    """
    import torch

    from disaggsdk.engine import weights
    from disaggsdk.models import is_tiny, resolve_model
    from disaggsdk.models.catalog import CATALOG
    from disaggsdk.models.quantization import block_fp8_of
    from disaggsdk.models.shipped import checkpoint_directory

    if load_format not in LOAD_FORMATS:
        raise ModelError(f"unknown load_format {load_format!r}; use one of {LOAD_FORMATS}")
    arch = resolve_model(model)
    check_supported(arch)
    check_tp(arch, tp.size)
    cls = model_class(arch.family)
    if model in CATALOG and not is_tiny(model):
        # checked before allocating: a full-size model would not fit in memory anyway
        raise ModelError(f"{model!r} is a full-size catalog model with no weights on this machine; pass its "
                         f"checkpoint directory, or use a tiny variant ({', '.join(n for n in CATALOG if is_tiny(n))})")
    torch_dtype = resolve_dtype(dtype)
    with torch.device(device):
        net = cls(arch, tp, torch_dtype)
    directory = checkpoint_directory(model) if load_format == "auto" else None
    if directory is None:
        weights.init_random(net, seed=seed)
    else:
        # a block-FP8 checkpoint is dequantized into ``torch_dtype`` as it loads (engine/fp8_blocks.py)
        weights.load_checkpoint(net, directory, block_fp8_of(arch.hf_config, arch.name))
    net.eval()
    net.requires_grad_(False)
    return net

