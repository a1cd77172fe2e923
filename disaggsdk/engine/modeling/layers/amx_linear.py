"""bfloat16 y = x W^T on Intel AMX tiles for the few rows of decoding, W packed once at load."""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import torch

ENV = "DISAGGSDK_AMX_LINEAR"  # "0": never use the kernel
TILE_N, TILE_K, TILE_PAIRS = 16, 32, 16  # output features and inputs per weight tile (16 input pairs)

_available: bool | None = None


def _kernels():
    from disaggsdk.engine.modeling.layers import _amx_linear

    return _amx_linear


def kernel_built() -> bool:
    """Whether the optional extension (native/cpu_linear/) was built into this install."""
    try:
        _kernels()
    except ImportError:
        return False
    return True


def available() -> bool:
    """Whether the kernel runs here: built, not turned off, and the CPU and kernel allow AMX
    (checked once per process; asking Linux for the tile state is part of the check)."""
    global _available
    if _available is None:
        _available = False
        # torch's AMX check is private API: without it, Linux's answer below decides alone
        amx_cpu = getattr(torch.cpu, "_is_amx_tile_supported", lambda: True)()
        if os.environ.get(ENV, "1") != "0" and amx_cpu:
            try:
                _available = _kernels().lib.amx_linear_init() == 0
            except ImportError:  # the optional extension was not built
                pass
    return _available


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `pack` takes ``weight``: a bfloat16 CPU [out, in] matrix (or a stack of them) with
    out a multiple of 16 and in a multiple of 32."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() in (2, 3)
            and weight.shape[-2] % TILE_N == 0 and weight.shape[-1] % TILE_K == 0)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] (or [experts, out, in]) in the kernel's tiles:
    [..., out / 16, in / 32, 16 input pairs, 16 features x 2] — tile (nb, kb), row i holds
    (w[n][32 kb + 2i], w[n][32 kb + 2i + 1]) for its 16 features n."""
    *lead, out_features, in_features = weight.shape
    tiles = weight.reshape(*lead, out_features // TILE_N, TILE_N, in_features // TILE_K, TILE_PAIRS, 2)
    order = list(range(len(lead))) + [len(lead) + i for i in (0, 2, 3, 1, 4)]
    return tiles.permute(order).reshape(*lead, out_features // TILE_N, in_features // TILE_K,
                                        TILE_PAIRS, 2 * TILE_N).contiguous()


def pack_if_useful(weight: torch.Tensor) -> torch.Tensor | None:
    """`pack` (weight) where the kernel runs here and takes it, else None."""
    return pack(weight) if available() and can_pack(weight) else None


@runtime_checkable
class DecodePackable(Protocol):
    """A module that multiplies by a weight and can keep the weight's packed form (a linear layer,
    the experts, a model's head)."""

    def pack_for_decode(self) -> int:
        """Pack where the kernel runs here; returns how many tensors were packed."""
        ...


def pack_model(model: torch.nn.Module) -> int:
    """Call ``pack_for_decode`` of every `DecodePackable` module of ``model`` (layers that multiply
    by a weight keep its packed form there); returns how many tensors they packed."""
    return sum(module.pack_for_decode() for module in model.modules() if isinstance(module, DecodePackable))


def _amx_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x [rows, in] bfloat16 times the packed weight ([out / 16, in / 32, 16, 32]): [rows, out]."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    out_features = packed.shape[0] * TILE_N
    out = torch.empty(x.shape[0], out_features, dtype=torch.bfloat16)
    kernels = _kernels()
    cast = kernels.ffi.cast
    status = kernels.lib.amx_bf16_linear(cast("uint16_t *", x.data_ptr()), x.shape[0], x.stride(0),
                                         cast("uint16_t *", packed.data_ptr()), out_features, x.shape[1],
                                         cast("uint16_t *", out.data_ptr()), out_features)
    if status != 0:  # only packed weights reach here, and packing checked `available`
        raise RuntimeError("amx_linear: the AMX tile state was not granted to this process")
    return out


def grouped(x: torch.Tensor, packed: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
    """A mixture of experts' products on the kernel: rows [group_ends[g - 1], group_ends[g]) of x
    (sorted by expert) times expert g's packed weight (`pack` of [experts, out, in]); [rows, out]
    bfloat16. The kernel reads the group ends itself: no host sync."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    ends = group_ends.to(torch.int32).contiguous()
    out_features = packed.shape[1] * TILE_N
    out = torch.empty(x.shape[0], out_features, dtype=torch.bfloat16)
    kernels = _kernels()
    cast = kernels.ffi.cast
    status = kernels.lib.amx_bf16_grouped_linear(
        cast("uint16_t *", x.data_ptr()), x.stride(0), cast("int32_t *", ends.data_ptr()), ends.shape[0],
        cast("uint16_t *", packed.data_ptr()), out_features, x.shape[1], cast("uint16_t *", out.data_ptr()),
        out_features)
    if status != 0:
        raise RuntimeError("amx_linear: the AMX tile state was not granted to this process")
    return out


# ``torch.ops.disaggsdk.amx_linear``: a graph op, so that a compiled step calls the kernel as one
# opaque call. Defined with torch.library.Library rather than the custom_op decorator: the
# decorator's wrapping costs ~5 us more a call, and a decode step makes dozens of these calls.
_LIBRARY = torch.library.Library("disaggsdk", "FRAGMENT")
_LIBRARY.define("amx_linear(Tensor x, Tensor packed) -> Tensor")
_LIBRARY.impl("amx_linear", _amx_linear, "CPU")


@torch.library.register_fake("disaggsdk::amx_linear", lib=_LIBRARY)
def _(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], packed.shape[0] * TILE_N)
