"""A torch view of device-addressable memory torch did not allocate (a cuMem mapping, or pinned host
memory that unified addressing makes a device pointer), through the CUDA array interface.

`torch.as_tensor` reads ``__cuda_array_interface__`` and keeps the object holding it alive as long as
the tensor lives, so ``owner`` (whatever keeps the memory valid) lives as long as the view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class _CudaArrayInterface:
    """A [num_bytes] uint8 array at a device address (the CUDA array interface, version 3, no stream:
    the producer has nothing queued the consumer must wait for)."""

    def __init__(self, address: int, num_bytes: int, owner: object):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (num_bytes,), "typestr": "|u1", "data": (address, False), "strides": None, "version": 3,
        }


def cuda_bytes(address: int, num_bytes: int, owner: object = None, device: str | None = None) -> torch.Tensor:
    """``[address, + num_bytes)`` as a CUDA uint8 tensor sharing that memory (imports torch).

    Args:
        address: a device address (or a host address unified addressing maps).
        num_bytes: the length.
        owner: kept alive as long as the tensor (e.g. the pinned tensor or the mapping).
        device: the CUDA device to put the tensor on; None: the one torch finds the pointer on.
    """
    import torch

    return torch.as_tensor(_CudaArrayInterface(address, num_bytes, owner), device=device)
