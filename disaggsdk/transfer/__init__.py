"""Transport: fabric-lib (native/) over libfabric, and the node's NIC/NUMA/GPU topology.

Only this package imports the native module, and only on first use: importing it is light.
Completions arrive as `concurrent.futures.Future`; in asyncio, `await asyncio.wrap_future(f)`.
"""

from __future__ import annotations

from disaggsdk.transfer.errors import NativeLibraryMissing, TransferError

__all__ = ["MemoryRegion", "NativeLibraryMissing", "Peer", "RegionDescriptor", "TransferEngine",
           "TransferError", "WriteBatch", "discover_topology"]


def __getattr__(name: str):
    if name == "TransferEngine":
        from disaggsdk.transfer.engine import TransferEngine

        return TransferEngine
    if name in ("MemoryRegion", "Peer", "RegionDescriptor", "WriteBatch"):
        from disaggsdk.transfer import descriptors

        return getattr(descriptors, name)
    if name == "discover_topology":
        from disaggsdk.transfer.topology import discover_topology

        return discover_topology
    raise AttributeError(f"module 'disaggsdk.transfer' has no attribute {name!r}")
