"""Where a deployment's transport reads and writes KV pages: in the pools, or through host mirrors.

What `launch.kv_registration` decides at launch, said ahead of time from the spec alone. Only ``auto`` with
GPU pools on shm depends on the machine (whether its libfabric was built with CUDA IPC), and the
plan says so; each unit logs what it chose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.spec.types import Spec


def mirror_wanted(spec: Spec) -> bool | None:
    """Whether units stage their pools through host mirrors: True / False where the spec settles it,
    None where it depends on what the provider can register at launch (``auto`` with GPU pools)."""
    if spec.transport.kv_staging == "host":
        return True
    if spec.device == "cpu" or spec.transport.kv_staging == "direct":
        return False
    return None


def kv_staging_summary(spec: Spec) -> str:
    """One line: how pages reach the wire for ``spec`` (``$.transport.kv_staging`` against device and provider)."""
    provider = spec.transport.provider
    wanted = mirror_wanted(spec)
    if wanted is True:
        return "KV through host mirrors of each rank's pool (transport.kv_staging: host)"
    if spec.device == "cpu":
        return "KV pools in host memory (memfd), registered as they are"
    if wanted is False:
        return f"GPU KV pools registered as device memory (FI_HMEM_CUDA); launch fails where {provider} cannot"
    if provider == "tcp":
        return "GPU KV pools staged through host mirrors: tcp cannot register device memory"
    if provider in ("efa", "verbs"):
        return f"GPU KV pools registered as device memory ({provider}, FI_HMEM_CUDA), else through host mirrors"
    return (f"GPU KV pools registered as device memory where {provider}'s libfabric has CUDA IPC, else through "
            "host mirrors (each unit logs which)")
