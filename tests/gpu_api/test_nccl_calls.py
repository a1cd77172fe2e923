"""A CUDA rank joins its process groups through the installed torch.distributed (CPU, no GPU needed).

`join_groups` takes its NCCL branch for a ``cuda`` engine: ``torch.cuda.set_device`` and an
``nccl`` process group. Here those two calls are bound to torch's own signatures (and the backend
name to the backends torch knows), then the group is made with gloo in its place, the one piece of
device work left out; everything after it (the gloo control group the steps are broadcast over) is
torch's real code. The collectives themselves (broadcast, all_reduce, all_gather,
all_to_all_single) take the same calls under gloo as under NCCL, and run for real in the CPU
tests of tp_group, dp_lockstep and expert parallelism.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.group_address import free_loopback_address
from disaggsdk.engine.tp_group import join_groups
from tests.gpu_api.installed_signatures import CallRecorder, Rules, stand_in


def test_a_cuda_rank_joins_an_nccl_group_through_the_installed_signatures(monkeypatch):
    recorder = CallRecorder(Rules(), answers={})
    real_init = dist.init_process_group

    def init_with_gloo(*args: object, **kwargs: object) -> None:
        call = recorder.check("init_process_group", real_init, args, kwargs)
        assert call.arguments["backend"] == dist.Backend.NCCL  # a name torch knows, and the GPU's
        call.bound.arguments["backend"] = "gloo"  # the communicator: the device work left out
        real_init(*call.bound.args, **call.bound.kwargs)

    monkeypatch.setattr(dist, "init_process_group", init_with_gloo)
    monkeypatch.setattr(torch.cuda, "set_device", stand_in(torch.cuda.set_device, recorder))
    groups = join_groups(EngineConfig(device="cuda"), num_experts=0, tp_rank=0, address=free_loopback_address(),
                         timeout_s=30)
    try:
        assert [call.name for call in recorder.calls] == ["set_device", "init_process_group"]
        assert recorder.calls[0].arguments == {"device": 0}
        assert groups.tp.group is dist.group.WORLD and groups.lockstep is None
        assert dist.get_backend(groups.control) == dist.Backend.GLOO  # step metadata stays on the CPU
        header = torch.tensor([1, 2, 3])
        dist.broadcast(header, group_src=0, group=groups.control)  # the control group works
        assert header.tolist() == [1, 2, 3]
    finally:
        dist.destroy_process_group()
