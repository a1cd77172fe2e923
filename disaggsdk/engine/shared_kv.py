"""A tensor-parallel worker's KV pool in shared memory, its fd handed to the instance head.

One transfer engine on the head process registers every rank's pool (shared/DESIGN.md, "Shared
KV memory"). A worker started with ``RunnerConfig.kv_share_path`` allocates its pool as a memfd,
connects to that Unix socket, sends its tp rank (4 bytes) and then the fd (SCM_RIGHTS), and keeps
the region for the model runner. The head side is `disaggsdk.launch.pool_collector`.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import struct
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.engine.model_runner import RunnerConfig
    from disaggsdk.engine.parallel import TensorParallel
    from disaggsdk.memory.shared_memory import SharedRegion

RANK_HEADER = struct.Struct("<I")
_PR_SET_PDEATHSIG = 1


class SharedKVError(DisaggError):
    """A worker could not hand its KV pool to the instance head."""


def pool_bytes(config: RunnerConfig, tp: TensorParallel) -> int:
    """Bytes of this rank's KV pool under ``config``."""
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.models import kv_geometry
    from disaggsdk.models import resolve_model

    geometry = kv_geometry(resolve_model(config.model), tp)
    return KVCache.page_format(geometry, config.num_pages, config.page_size, config.layout, config.kv_dtype).pool_bytes


def share_pool(config: RunnerConfig, tp: TensorParallel) -> SharedRegion:
    """Create this rank's pool as a memfd and send it to the head at ``config.kv_share_path``.

    Returns:
        The region (keep it alive as long as the model runner uses it).
    Raises:
        SharedKVError: the head is not listening or went away.
    """
    from disaggsdk.memory.fd_passing import send_region
    from disaggsdk.memory.shared_memory import SharedRegion

    region = SharedRegion.create(pool_bytes(config, tp), f"disaggsdk-kv-rank{tp.rank}")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            sock.connect(config.kv_share_path)
            sock.sendall(RANK_HEADER.pack(tp.rank))
            send_region(sock, region)
            sock.recv(1)  # the head's ack: it has mapped the region
    except OSError as exc:
        region.close()
        raise SharedKVError(f"tp rank {tp.rank}: cannot hand the KV pool to the head at "
                            f"{config.kv_share_path}: {exc}") from exc
    return region


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies, so no rank outlives its launcher."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's close() still stops every process
