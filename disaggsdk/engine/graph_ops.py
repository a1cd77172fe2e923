"""The ops a compiled model step holds: attention and the layer counter as custom torch ops."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import AttentionBackend
    from disaggsdk.engine.layer_counter.host import LayerCounter

_ids = itertools.count(1)
_backends: weakref.WeakValueDictionary[int, AttentionBackend] = weakref.WeakValueDictionary()
_counters: weakref.WeakValueDictionary[int, LayerCounter] = weakref.WeakValueDictionary()
# set on a background compile's thread only, within `warm_up_redirect`: backend id -> scratch backend
_warm_up = threading.local()


@contextmanager
def warm_up_redirect(scratch_backends: Mapping[int, AttentionBackend]) -> Iterator[None]:
    """Within, on this thread: the attention ops of the ids in ``scratch_backends`` run on those
    backends (planned by the caller), and ``layer_done`` ops do nothing (see the module docstring)."""
    _warm_up.backends = scratch_backends
    try:
        yield
    finally:
        del _warm_up.backends


def _backend(backend_id: int) -> AttentionBackend:
    scratch: Mapping[int, AttentionBackend] | None = getattr(_warm_up, "backends", None)
    return scratch[backend_id] if scratch is not None else _backends[backend_id]


@torch.library.custom_op("disaggsdk::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend_id: int, layer_id: int,
              sm_scale: float) -> torch.Tensor:
    """`AttentionBackend.run` of the backend registered as ``backend_id``."""
    return _backend(backend_id).run(layer_id, q, k, v, sm_scale)


@attention.register_fake
def _attention_shape(q, k, v, backend_id, layer_id, sm_scale):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[2])


@torch.library.custom_op("disaggsdk::attention_mla", mutates_args=())
def attention_mla(q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor,
                  backend_id: int, layer_id: int, sm_scale: float) -> torch.Tensor:
    """`AttentionBackend.run_mla` of the backend registered as ``backend_id``."""
    return _backend(backend_id).run_mla(layer_id, q_latent, q_rope, kv_latent, k_rope, sm_scale)


@attention_mla.register_fake
def _attention_mla_shape(q_latent, q_rope, kv_latent, k_rope, backend_id, layer_id, sm_scale):
    return q_latent.new_empty(q_latent.shape)


@torch.library.custom_op("disaggsdk::layer_done", mutates_args=("counter",))
def layer_done(counter: torch.Tensor, after: torch.Tensor, counter_id: int, layer_id: int) -> None:
    """Layer ``layer_id`` of the running step is complete (``after``: its output, for ordering)."""
    if getattr(_warm_up, "backends", None) is None:  # a background warm-up's steps are no one's layers
        _counters[counter_id].on_layer_done(layer_id)


@layer_done.register_fake
def _layer_done_shape(counter, after, counter_id, layer_id):
    return None


class GraphAttention:
    """An attention backend's `run`/`run_mla` as graph ops (see the module docstring).

    Args:
        backend: the planned backend the ops reach; keep it alive as long as this object.
    """

    def __init__(self, backend: AttentionBackend):
        self.backend = backend
        self.backend_id = next(_ids)
        _backends[self.backend_id] = backend

    def run(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """See `AttentionBackend.run`."""
        return torch.ops.disaggsdk.attention(q, k, v, self.backend_id, layer_id, sm_scale)

    def run_mla(self, layer_id: int, q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor,
                k_rope: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """See `AttentionBackend.run_mla`."""
        return torch.ops.disaggsdk.attention_mla(q_latent, q_rope, kv_latent, k_rope, self.backend_id, layer_id,
                                                 sm_scale)


class GraphLayerCounter:
    """A `LayerCounter` bumped by the ``layer_done`` op: the model calls it as it calls
    ``batch.on_layer_done`` (``(layer_id, after)``)."""

    def __init__(self, counter: LayerCounter):
        self.counter = counter
        self.counter_id = next(_ids)
        _counters[self.counter_id] = counter

    def __call__(self, layer_id: int, after: torch.Tensor) -> None:
        torch.ops.disaggsdk.layer_done(self.counter.values, after, self.counter_id, layer_id)
