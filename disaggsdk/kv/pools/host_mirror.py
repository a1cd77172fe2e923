"""KV pools behind host copies, for a transport that cannot reach the pools' own memory."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class HostMirror:
    """Copies pages between each rank's engine pool and its host mirror.

    Args:
        engine_pools: each tp rank's pool as the engine computes in it, [pool_bytes] uint8, on its device.
        host_pools: each rank's mirror, [pool_bytes] uint8 host memory (registered with the transport).
        num_layers: KV layers of a pool (the model's, plus the MTP layer's when it drafts).
        num_pages: pages per layer.
    Raises:
        ValueError: the pools disagree in count or size, the size is not layers x pages x page bytes, or a
            mirror is not host memory.
    """

    def __init__(self, engine_pools: Sequence[torch.Tensor], host_pools: Sequence[torch.Tensor], num_layers: int,
                 num_pages: int):
        if len(engine_pools) != len(host_pools) or not engine_pools:
            raise ValueError(f"{len(engine_pools)} engine pools but {len(host_pools)} host mirrors: one each per tp rank")
        size = engine_pools[0].numel()
        if size % (num_layers * num_pages):
            raise ValueError(f"a {size}-byte pool is not {num_layers} layers x {num_pages} pages of whole pages")
        page_bytes = size // (num_layers * num_pages)
        shape = (num_layers, num_pages, page_bytes)
        for pool in (*engine_pools, *host_pools):
            if pool.numel() != size:
                raise ValueError(f"every pool and mirror must hold {size} bytes; one holds {pool.numel()}")
        if any(p.device.type != "cpu" for p in host_pools):
            raise ValueError("a mirror is host memory (what the transport can register), not device memory")
        self._engine = [p.view(shape) for p in engine_pools]
        self._host = [p.view(shape) for p in host_pools]
        self.page_bytes = page_bytes
        self._lock = threading.Lock()  # the streamer thread stages out while the messenger's stages in
        self.bytes_to_host = 0  # staged device -> mirror, all ranks
        self.bytes_to_device = 0  # staged mirror -> device, all ranks
        self._streams = [_copy_stream(p.device) for p in engine_pools]

    def to_host(self, layer_id: int, page_ids: Sequence[int]) -> None:
        """Copy layer ``layer_id`` of ``page_ids`` from every rank's engine pool to its mirror.

        Call once the layer is complete on every rank (the layer counter has passed it): the copy
        runs on a stream of its own and does not wait for the rest of the step.
        """
        if not page_ids:
            return
        import torch

        index = torch.tensor(page_ids, dtype=torch.int64)
        for engine, host, stream in zip(self._engine, self._host, self._streams, strict=True):
            with _on(stream):
                rows = engine[layer_id].index_select(0, index.to(engine.device))
                host[layer_id].index_copy_(0, index, rows.to("cpu"))  # .to("cpu") waits for the copy
        with self._lock:
            self.bytes_to_host += len(page_ids) * self.page_bytes * len(self._engine)

    def to_device(self, page_ids: Sequence[int]) -> None:
        """Copy every layer of ``page_ids`` from each rank's mirror into its engine pool.

        Call from the engine's thread before it schedules the request: the copy is queued on that
        thread's current stream, ahead of the step that reads the pages.
        """
        if not page_ids:
            return
        import torch

        index = torch.tensor(page_ids, dtype=torch.int64)
        for engine, host in zip(self._engine, self._host, strict=True):
            rows = host.index_select(1, index)  # [num_layers, len(page_ids), page_bytes]
            engine.index_copy_(1, index.to(engine.device), rows.to(engine.device))
        with self._lock:
            self.bytes_to_device += len(page_ids) * self.page_bytes * self._engine[0].shape[0] * len(self._engine)


def _copy_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A CUDA stream for a device's staging copies (None on the CPU)."""
    if device.type != "cuda":
        return None
    import torch

    return torch.cuda.Stream(device=device)


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _on(stream: torch.cuda.Stream | None) -> _NoStream | torch.cuda.StreamContext:
    """``with`` this: the copies inside run on ``stream`` (nothing changes on the CPU)."""
    if stream is None:
        return _NoStream()
    import torch

    return torch.cuda.stream(stream)
