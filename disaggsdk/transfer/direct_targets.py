"""The same-host target regions one initiator writes with memcpy (see same_host.py).

A target region is mapped here the first time a batch goes to it, and kept until the engine
closes: mapping costs an open, an fstat and a populated mmap, too much for every batch. A region
that cannot be mapped (another machine, the target exited, the native engine refuses the address)
is remembered as such, and its writes go through libfabric from then on; why is kept in
`failures`, because a silent fall back to the slow path would otherwise look like a slow machine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from disaggsdk.transfer.errors import TransferError
from disaggsdk.transfer.same_host import PeerMapping

if TYPE_CHECKING:
    from disaggsdk.transfer.descriptors import RegionDescriptor


class DirectTargets:
    """The same-host regions this engine has tried to map, keyed by (addr_base, key).

    Holds no reference to the engine, so the engine's finalizer may own it.
    """

    def __init__(self) -> None:
        self._mappings: dict[tuple[int, int], PeerMapping | None] = {}  # None: mapping failed, use libfabric
        self._lock = threading.Lock()
        self.failures: list[str] = []  # why a same-host region went through libfabric

    def attach_once(self, dst: RegionDescriptor, attach: Callable[[int], None]) -> None:
        """Map ``dst`` and hand it to the native engine, unless that was tried already.

        Args:
            dst: the target region; without a same-host block nothing is done.
            attach: gives the native engine the address of byte 0 of the mapped region;
                raises TransferError if it refuses it.
        """
        region = (dst.addr_base, dst.key)
        if dst.same_host is None or region in self._mappings:
            return
        with self._lock:  # submitting threads race for the first batch to a region
            if region not in self._mappings:
                self._mappings[region] = self._map(dst, attach)

    def _map(self, dst: RegionDescriptor, attach: Callable[[int], None]) -> PeerMapping | None:
        assert dst.same_host is not None, "only a region shared on this machine is mapped"
        try:
            mapping = PeerMapping(dst.same_host, dst.length_bytes)
        except TransferError as exc:
            self.failures.append(str(exc))
            return None
        try:
            attach(mapping.address)
        except TransferError as exc:
            mapping.close()
            self.failures.append(str(exc))
            return None
        return mapping

    def close(self) -> None:
        """Unmap every region; the native engine must be closed first (it may still copy into them)."""
        for mapping in self._mappings.values():
            if mapping is not None:
                mapping.close()
