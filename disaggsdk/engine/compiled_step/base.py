"""The compiled step contract: what `ModelRunner.run` drives in place of the eager forward, met by
the CPU twin (`torch_compile.CompiledStep`) and the CUDA twin (`cuda_graphs.CudaGraphStep`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.forward_batch import ForwardBatch


class AnyCompiledStep(Protocol):
    """A rank's step in a faster form than ``model(batch, backend)``: the CPU twin `CompiledStep`
    (torch.compile, attention and the layer counter as graph ops) or, on a CUDA device,
    `CudaGraphStep` (decode steps replayed as CUDA graphs at padded batch sizes).

    The runner asks `can_run` for each batch; where it says no, the batch runs eagerly.
    """

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether this step runs ``batch`` (else the caller runs it eagerly)."""
        ...

    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states after the final norm for a ``batch`` `can_run` accepted, [num_tokens,
        hidden_size]; it plans the attention it runs for ``batch`` itself."""
        ...
