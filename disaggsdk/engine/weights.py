"""Model weights: where each checkpoint tensor goes, loading it from safetensors, random init.

A model lists its `WeightSlot`s: one per checkpoint tensor, naming the tensor as Hugging Face
stores it, its full shape, and the view of a parameter that receives this rank's slice. Loading
from a directory and seeded random init walk the same list, so a tiny random model and a loaded
checkpoint take one code path, and a tp=2 random model is the tp=1 model cut in two.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import torch

from disaggsdk.errors import ModelError

if TYPE_CHECKING:
    from disaggsdk.models.quantization import BlockFP8

INIT_STD = 0.02  # as transformers' `initializer_range` default for these families


@dataclass(frozen=True)
class WeightSlot:
    """One checkpoint tensor and where this rank keeps (its slice of) it."""

    name: str  # checkpoint tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
    target: torch.Tensor  # a view of a parameter, shaped as the full tensor sliced on shard_dim
    full_shape: tuple[int, ...]  # shape of the tensor in the checkpoint
    shard_dim: int | None = None  # dimension this rank keeps a range of; None: replicated
    shard: tuple[int, int] = (0, 0)  # [start, stop) along shard_dim
    init: Literal["normal", "ones", "zeros"] = "normal"
    # Slots of an optional group (e.g. "mtp") may be absent from a checkpoint, but only together.
    optional_group: str | None = None

    def local_shape(self) -> tuple[int, ...]:
        """The shape of this rank's slice."""
        if self.shard_dim is None:
            return self.full_shape
        shape = list(self.full_shape)
        shape[self.shard_dim] = self.shard[1] - self.shard[0]
        return tuple(shape)


@runtime_checkable
class WeightOwner(Protocol):
    """A module that holds checkpoint tensors itself (a linear, a norm, an embedding, experts);
    a model's `weight_slots` collects the slots of each such module of its tree."""

    def own_slots(self) -> Iterator[WeightSlot]: ...


class HasWeightSlots(Protocol):
    """A model whose checkpoint tensors can be listed (see `DecoderModel.weight_slots`)."""

    def weight_slots(self) -> Iterable[WeightSlot]: ...

    def drop_optional(self, group: str) -> None: ...


class SafetensorsFile(Protocol):
    """An open safetensors file (``safe_open(path, framework="pt")``): tensors read lazily by name."""

    def get_slice(self, name: str) -> SafetensorsSlice: ...


class SafetensorsSlice(Protocol):
    """A lazily read tensor of a safetensors file (``safe_open(...).get_slice(name)``): indexing
    reads only the selected part."""

    def __getitem__(self, index: slice | tuple[slice, ...]) -> torch.Tensor: ...

    def get_shape(self) -> list[int]: ...

    def get_dtype(self) -> str: ...


def _check_slot(slot: WeightSlot) -> None:
    # A wrong slot is a bug in a model file, not a user error.
    assert tuple(slot.target.shape) == slot.local_shape(), (
        f"{slot.name}: target {tuple(slot.target.shape)} != local slice {slot.local_shape()}"
    )


def _slice(full_or_handle: torch.Tensor | SafetensorsSlice, slot: WeightSlot) -> torch.Tensor:
    if slot.shard_dim is None:
        return full_or_handle[:]
    index = [slice(None)] * len(slot.full_shape)
    index[slot.shard_dim] = slice(*slot.shard)
    return full_or_handle[tuple(index)]


def init_random(model: HasWeightSlots, seed: int = 0) -> None:
    """Fill every slot with seeded random values (norm weights with ones).

    Each tensor's generator is seeded from ``seed`` and the tensor's name, and the full tensor is
    drawn before slicing, so every rank and every tp size see the same full model.

    Args:
        model: the model to fill (this rank's shard).
        seed: the model's seed; the same seed gives the same weights.
    """
    for slot in model.weight_slots():
        _check_slot(slot)
        if slot.init == "ones":
            slot.target.fill_(1.0)
            continue
        if slot.init == "zeros":
            slot.target.zero_()
            continue
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(slot.name.encode()))
        full = torch.randn(slot.full_shape, generator=gen, dtype=torch.float32) * INIT_STD
        slot.target.copy_(_slice(full, slot))


def checkpoint_files(directory: Path) -> dict[str, Path]:
    """Map every tensor name of a checkpoint directory to the safetensors file holding it.

    Raises:
        ModelError: no model.safetensors nor model.safetensors.index.json, an unreadable index,
            or an index naming a file that is not there.
    """
    index_path = directory / "model.safetensors.index.json"
    single = directory / "model.safetensors"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelError(f"{index_path} is not a safetensors index ({exc}); re-save the checkpoint") from None
        files = {name: directory / file for name, file in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise ModelError(f"{index_path} names shard {path.name!r}, which is missing from {directory}")
        return files
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as handle:
            return {name: single for name in handle.keys()}
    raise ModelError(f"{directory} has no model.safetensors or model.safetensors.index.json; "
                     f"save the model with save_pretrained (safetensors format)")


def load_checkpoint(model: HasWeightSlots, directory: Path, quantization: BlockFP8 | None = None) -> None:
    """Load this rank's slice of every slot from a Hugging Face safetensors checkpoint.

    Tensors are read slice by slice (only this rank's range) and cast to the parameter's dtype.
    Tensors the model does not use (e.g. rotary caches) are ignored. An optional group wholly
    absent from the checkpoint (DeepSeek's MTP layer, which transformers does not save) is
    dropped from the model. In a block-FP8 checkpoint (``quantization``) every tensor the format
    quantizes is read with its ``weight_scale_inv`` and dequantized at load (`fp8_blocks`: why at
    load); every other tensor must be stored unquantized, so no FP8 value is ever used without its scale.

    Args:
        model: the model to fill (this rank's shard).
        directory: the checkpoint directory.
        quantization: the checkpoint's block-FP8 format (``block_fp8_of(config)``), or None for an
            unquantized checkpoint.

    Raises:
        ModelError: a tensor is missing or has another shape than the config implies (the
            message names the tensor and both shapes), the files cannot be read, or FP8 storage
            disagrees with the format: a quantized tensor without its scale tensor, a scale of the
            wrong shape or dtype, an FP8 tensor the format does not quantize (or any FP8 tensor in an
            unquantized checkpoint), an unquantized tensor where the format expects FP8, or a scale
            tensor beside a tensor the format does not quantize.
    """
    from safetensors import safe_open

    files = checkpoint_files(directory)
    slots = list(model.weight_slots())
    for group in sorted({s.optional_group for s in slots if s.optional_group}):
        members = [s for s in slots if s.optional_group == group]
        present = [s.name in files for s in members]
        if not any(present):
            model.drop_optional(group)
            slots = [s for s in slots if s.optional_group != group]
        elif not all(present):
            absent = next(s.name for s in members if s.name not in files)
            raise ModelError(f"{directory}: checkpoint has part of the {group} weights but lacks tensor {absent!r}; "
                             f"provide all of them or none")
    missing = [s for s in slots if s.name not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelError(f"{directory}: checkpoint lacks tensor {missing[0].name!r} of shape "
                         f"{list(missing[0].full_shape)}{more}; is the checkpoint complete and does config.json match it?")
    handles: dict[Path, SafetensorsFile] = {}

    def open_slice(name: str) -> SafetensorsSlice:
        path = files[name]
        if path not in handles:
            handles[path] = safe_open(str(path), framework="pt")
        return handles[path].get_slice(name)

    try:
        for slot in slots:
            _check_slot(slot)
            view = open_slice(slot.name)
            shape = tuple(view.get_shape())
            if shape != slot.full_shape:
                raise ModelError(f"{directory}: tensor {slot.name!r} has shape {list(shape)} in {files[slot.name].name} but the "
                                 f"config implies {list(slot.full_shape)}; config.json and the weights disagree")
            if quantization is not None and quantization.is_quantized(slot.name, slot.full_shape):
                slot.target.copy_(_read_block_fp8(slot, view, open_slice, files, quantization, directory))
            else:
                _check_unquantized(slot, view, files, quantization, directory)
                slot.target.copy_(_slice(view, slot))
    finally:
        handles.clear()


def _read_block_fp8(slot: WeightSlot, view: SafetensorsSlice, open_slice: Callable[[str], SafetensorsSlice],
                    files: dict[str, Path], quantization: BlockFP8, directory: Path) -> torch.Tensor:
    """This rank's slice of a tensor the format quantizes, checked against the format and dequantized."""
    from disaggsdk.engine import fp8_blocks
    from disaggsdk.models.quantization import scale_name

    dtype = view.get_dtype()
    if dtype != "F8_E4M3":
        raise ModelError(f"{directory}: tensor {slot.name!r} is stored as {dtype} but config.json's quantization_config "
                         f"(block fp8) quantizes it to F8_E4M3 with a scale; re-quantize the checkpoint "
                         f"(python -m tools.fp8_checkpoint) or list its module in quantization_config.modules_to_not_convert")
    scale = scale_name(slot.name)
    if scale not in files:
        raise ModelError(f"{directory}: FP8 tensor {slot.name!r} has no scale tensor {scale!r}; a block-fp8 checkpoint "
                         f"stores one weight_scale_inv per quantized weight: the checkpoint is incomplete")
    scale_view = open_slice(scale)
    want = quantization.scale_shape(slot.full_shape)
    got = tuple(scale_view.get_shape())
    if got != want:
        raise ModelError(f"{directory}: scale tensor {scale!r} has shape {list(got)} but a {list(slot.full_shape)} weight in "
                         f"{quantization.block_rows}x{quantization.block_cols} blocks needs {list(want)}; the scales do not "
                         f"belong to this weight or config.json's weight_block_size is wrong")
    if scale_view.get_dtype() not in fp8_blocks.SCALE_DTYPE_NAMES:
        raise ModelError(f"{directory}: scale tensor {scale!r} is stored as {scale_view.get_dtype()}; scales are "
                         f"{' or '.join(fp8_blocks.SCALE_DTYPE_NAMES)}")
    block = (quantization.block_rows, quantization.block_cols)
    return fp8_blocks.read_dequantized(view, scale_view, block, slot.shard_dim, slot.shard)


def _check_unquantized(slot: WeightSlot, view: SafetensorsSlice, files: dict[str, Path],
                       quantization: BlockFP8 | None, directory: Path) -> None:
    """Refuse FP8 storage of a tensor that the checkpoint's format leaves unquantized: copying it into
    a float parameter would drop its scale and load wrong weights silently."""
    from disaggsdk.engine import fp8_blocks
    from disaggsdk.models.quantization import SCALE_SUFFIX, scale_name

    if view.get_dtype() in fp8_blocks.FP8_DTYPE_NAMES:
        why = ("config.json has no quantization_config" if quantization is None
               else "config.json's quantization_config does not quantize it (embeddings, norms, router and "
                    "lm_head stay unquantized)")
        raise ModelError(f"{directory}: tensor {slot.name!r} is stored as {view.get_dtype()} but {why}; an FP8 tensor "
                         f"loads only with its scale under quant_method 'fp8': fix config.json or the checkpoint")
    if slot.name.endswith(".weight") and scale_name(slot.name) in files:
        raise ModelError(
            f"{directory}: tensor {slot.name!r} has a scale tensor {scale_name(slot.name)!r} but is stored as "
            f"{view.get_dtype()}, which the format does not quantize; a {SCALE_SUFFIX} belongs to F8_E4M3 weights only"
        )
