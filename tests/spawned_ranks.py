"""A group of spawned processes, one per rank of a torch.distributed group, that never outlives its
test: the expert dispatch tests (tests/engine) and the simulator's all-to-all check (tests/sim) start
theirs with it."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for ``init_method=tcp://127.0.0.1:PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: Callable[..., None], num_ranks: int, args: Sequence[object], timeout_s: float = 240) -> None:
    """Run ``target(rank, *args)`` in ``num_ranks`` spawned processes and wait for them all.

    ``target`` must be importable by the child (spawn hands it the parent's sys.path). Every process
    is joined, and killed if it is still alive when this returns or raises.

    Raises:
        AssertionError: a rank exited non-zero or did not finish within ``timeout_s`` (its stderr says why).
    """
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(rank, *args)) for rank in range(num_ranks)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout_s)
        assert [p.exitcode for p in procs] == [0] * num_ranks, "a rank failed; see its stderr"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
