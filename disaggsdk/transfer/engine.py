"""TransferEngine: the typed Python face of fabric-lib (native/fabric.h).

    # target (decode side): a region and an address go to the peer
    target = TransferEngine("shm")
    region = target.register(pool.buffer)                  # MemoryRegion: a local handle
    send_to_peer(target.address, region.descriptor.to_bytes())
    landed = target.expect(imm=request_id, count=num_pages)
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import attrs

from disaggsdk.transfer import completions as ev
from disaggsdk.transfer._native import check, load_native
from disaggsdk.transfer.descriptors import MemoryRegion, Peer, RegionDescriptor, WriteBatch
from disaggsdk.transfer.direct_targets import DirectTargets
from disaggsdk.transfer.endpoint import PROVIDER_ALIASES, close_endpoint, open_endpoint
from disaggsdk.transfer.errors import TransferError
from disaggsdk.transfer.progress_health import ProgressHealth
from disaggsdk.transfer.same_host import SameHostShare

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

_ADDRESS_MAX_BYTES = 256


class TransferEngine:
    """One libfabric RDM endpoint with its progress thread and completion pump.

    Args:
        provider: "shm", "tcp" (= "tcp;ofi_rxm"), "verbs", "efa", or a full libfabric name.
        domain: NIC / domain name ("mlx5_0", "eth0", "lo"). None: for tcp the interface
            ``FI_TCP_IFACE`` names, else "lo" (regions are not reachable from the network unless
            a NIC is named: `interfaces.tcp_domain`), the provider's first domain otherwise.
        hmem: ask for device-memory (FI_HMEM) support, needed to register GPU memory.
        direct: with shm, copy into target regions that were registered with ``shared_fd`` by
            mapping them here (see same_host.py): ~memcpy speed, and the copy runs on the
            initiator's core rather than the target's. False: every byte through libfabric.

    Raises:
        NativeLibraryMissing: the native library is not built or libfabric is missing.
        TransferError: the provider cannot open an RDM endpoint with RMA writes.
    """

    def __init__(self, provider: str = "shm", domain: str | None = None, *, hmem: bool = False,
                 direct: bool = True):
        self._ffi, self._lib = ffi, lib = load_native()
        self.provider = PROVIDER_ALIASES.get(provider, provider)
        # only shm is same-host by construction; tcp may be told to use loopback for tests
        self.direct = direct and self.provider == "shm"
        self._direct_targets = DirectTargets()
        self._engine = open_endpoint(ffi, lib, self.provider, domain, hmem)
        self.domain = ffi.string(lib.fab_domain_name(self._engine)).decode()
        self.mr_mode = int(lib.fab_mr_mode(self._engine))
        self.max_control_bytes = int(lib.fab_max_control_bytes())
        self._ids = itertools.count(1)
        self._id_lock = threading.Lock()
        self._closed = False
        self._peer_addresses: dict[int, bytes] = {}  # handle -> address, to name a stuck post's peer
        # whether the progress thread still goes round, and where it is stuck if not
        self.health = ProgressHealth(lib, self._engine, self._peer_addresses, lambda: self._closed)
        self._pump = ev.CompletionPump(ffi, lib, self._engine, f"fabric-{self.provider}")
        # an engine dropped without close() (or alive at exit) still stops its threads
        self._finalizer = weakref.finalize(self, close_endpoint, lib, self._engine, self._pump, self._direct_targets)

    # addresses

    @property
    def address(self) -> bytes:
        """This endpoint's address: give it to peers so they can `add_peer` it."""
        buf = self._ffi.new("uint8_t[]", _ADDRESS_MAX_BYTES)
        size = self._ffi.new("size_t *", _ADDRESS_MAX_BYTES)
        self._check(self._lib.fab_address(self._live(), buf, size), "reading the address")
        return bytes(self._ffi.buffer(buf, size[0]))

    def add_peer(self, address: bytes) -> Peer:
        """Inserts a peer's address.

        Returns:
            The peer handle to pass to `submit` and `send`.

        Raises:
            TransferError: the address is not one of this provider's.
        """
        out = self._ffi.new("uint64_t *")
        self._check(self._lib.fab_insert_peer(self._live(), address, len(address), out),
                    "inserting a peer address")
        peer = Peer(int(out[0]), bytes(address))
        self._peer_addresses[peer.handle] = peer.address
        return peer

    # memory

    def register(self, buffer: Buffer, *, shared_fd: int | None = None, shared_offset: int = 0,
                 remote_write: bool = True) -> MemoryRegion:
        """Registers a writable Python buffer (bytearray, mmap, memoryview, numpy array).

        The buffer stays exported (an mmap cannot be closed) until `deregister`.

        Args:
            shared_fd: the shared-memory file (memfd) the buffer maps, from byte ``shared_offset``:
                peers on this machine may then map it and write with memcpy (``direct``).
            remote_write: peers holding the descriptor may write into it; False for a region that
                is only ever a write source (its key then opens nothing to a peer).

        Raises:
            TransferError: the buffer is read-only, empty or the provider refuses it.
        """
        try:
            view = self._ffi.from_buffer(buffer, require_writable=True)
        except (TypeError, ValueError) as exc:
            raise TransferError(f"cannot register this buffer: {exc}; pass a writable "
                                "buffer such as a bytearray or an mmap") from exc
        address = int(self._ffi.cast("uintptr_t", view))
        region = self._register(address, len(view), 0, 0, keepalive=view, remote_write=remote_write)
        if shared_fd is None:
            return region
        share = SameHostShare.of_fd(shared_fd, shared_offset)
        return attrs.evolve(region, descriptor=attrs.evolve(region.descriptor, same_host=share))

    def register_pointer(self, address: int, length_bytes: int, *, cuda_device: int | None = None,
                         keepalive: object = None, remote_write: bool = True) -> MemoryRegion:
        """Registers raw memory (e.g. a cuMem mapping); the caller keeps it mapped meanwhile.

        Args:
            address: virtual address of the first byte.
            length_bytes: region length.
            cuda_device: CUDA device ordinal for device memory (needs hmem=True), None for host.
            keepalive: any object that must live as long as the registration.
            remote_write: as in `register`.

        Raises:
            TransferError: the provider refuses the registration.
        """
        iface = 0 if cuda_device is None else 1
        return self._register(address, length_bytes, iface, cuda_device or 0, keepalive, remote_write)

    def _register(self, address: int, length_bytes: int, iface: int, device: int,
                  keepalive: object, remote_write: bool = True) -> MemoryRegion:
        handle = self._ffi.new("uint64_t *")
        desc = self._ffi.new("fab_region_desc *")
        rc = self._lib.fab_register(self._live(), self._ffi.cast("void *", address),
                                    length_bytes, iface, device, int(remote_write), handle, desc)
        self._check(rc, f"registering {length_bytes} bytes")
        descriptor = RegionDescriptor(int(desc.addr_base), int(desc.key), int(desc.len),
                                      int(desc.mr_mode), int(desc.check))
        return MemoryRegion(int(handle[0]), address, length_bytes, descriptor, keepalive,
                            cuda_device=device if iface == 1 else None)

    def deregister(self, region: MemoryRegion) -> None:
        """Releases a registration and the buffer export `register` took.

        Raises:
            TransferError: write batches from the region are still in flight.
        """
        self._check(self._lib.fab_deregister(self._live(), region.handle), "deregistering")
        if isinstance(region.keepalive, self._ffi.CData):
            self._ffi.release(region.keepalive)  # un-export the buffer: an mmap may close now

    # writes and counters

    def submit(self, peer: Peer, batch: WriteBatch) -> Future:
        """Submits a batch of writes; bounds and the descriptor's check are verified first.

        Returns:
            A future resolved when every write of the batch completed locally (the data is out
            of the source buffer), or failed with TransferError carrying the provider's text.

        Raises:
            TransferError: an entry is out of either region's bounds, the descriptor is
                corrupted or from another provider, or the peer is unknown. Nothing was sent.
        """
        ffi = self._ffi
        d = batch.dst
        dst = ffi.new("fab_region_desc *", (d.addr_base, d.key, d.length_bytes, d.mr_mode, d.check))
        if self.direct:
            self._direct_targets.attach_once(d, lambda address: self._check(
                self._lib.fab_attach_direct(self._live(), dst, self._ffi.cast("void *", address)),
                "attaching a same-host region"))
        batch_id = self._next_id()
        return self._tracked(ev.EV_BATCH_DONE, batch_id, f"submitting {len(batch)} writes",
                             lambda: self._lib.fab_submit_writes(
                                 self._live(), batch_id, peer.handle, batch.src.handle, dst,
                                 ffi.from_buffer("uint64_t[]", batch.src_offsets),
                                 ffi.from_buffer("uint64_t[]", batch.dst_offsets),
                                 ffi.from_buffer("uint64_t[]", batch.lengths),
                                 ffi.from_buffer("uint32_t[]", batch.imms), len(batch)))

    def expect(self, imm: int, count: int) -> Future:
        """Future resolved once `count` write entries carrying `imm` have landed here.

        Raises:
            TransferError: imm is already expected (cancel it first).
        """
        return self._tracked(ev.EV_IMM_DONE, imm, f"expecting immediate {imm}",
                             lambda: self._lib.fab_expect(self._live(), imm, count))

    @property
    def num_open_counters(self) -> int:
        """Immediate counters expected and neither complete nor cancelled (a gauge: 0 when nothing is coming)."""
        return self._pump.num_tracked(ev.EV_IMM_DONE)

    def cancel(self, imm: int) -> None:
        """Retires the counter of `imm` without an event; its future is cancelled."""
        self._lib.fab_cancel(self._live(), imm)
        fut = self._pump.forget(ev.EV_IMM_DONE, imm)
        if fut is not None:
            fut.cancel()

    # control messages

    def send(self, peer: Peer, data: bytes) -> Future:
        """Sends a control message of at most `max_control_bytes`; the future resolves when sent.

        Raises:
            TransferError: the message is too large or the peer is unknown.
        """
        send_id = self._next_id()
        return self._tracked(ev.EV_SEND_DONE, send_id, f"sending {len(data)} bytes",
                             lambda: self._lib.fab_send(self._live(), send_id, peer.handle, data, len(data)))

    @property
    def wake(self) -> ev.WakeFd:
        """Readable when a control message arrived or a counter fired (`completions.WakeFd`)."""
        return self._pump.wake

    def recv(self, timeout_s: float | None = None) -> bytes:
        """Returns the next control message. Raises TransferError when none arrived within timeout_s."""
        import queue

        try:
            return self._pump.messages.get(timeout=timeout_s)
        except queue.Empty:
            raise TransferError(f"no control message within {timeout_s} s") from None

    # state

    def stats(self) -> dict[str, int]:
        """The native counters (writes posted/requested, immediates early/late, CQ errors...)."""
        out = self._ffi.new("fab_stats *")
        self._lib.fab_get_stats(self._live(), out)
        fields = [name for name, _ in self._ffi.typeof("fab_stats").fields]
        return {name: int(getattr(out, name)) for name in fields}

    @property
    def direct_failures(self) -> list[str]:
        """Why same-host regions went through libfabric rather than memcpy (empty: none did)."""
        return list(self._direct_targets.failures)

    @property
    def async_errors(self) -> list[str]:
        """Provider errors that were not tied to one of our operations (e.g. target side)."""
        return list(self._pump.async_errors)

    def close(self) -> None:
        """Stops the progress thread, fails unresolved futures and frees the endpoint."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        self._engine = None

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> Any:
        if self._closed:
            raise TransferError("the transfer engine is closed")
        return self._engine

    def _tracked(self, kind: int, key: int, what: str, call: Callable[[], int]) -> Future:
        """The future of event ``kind`` for ``key``, tracked before the native ``call`` (its completion
        may come before the call returns) and forgotten again when the call fails."""
        fut = self._pump.track(kind, key)
        rc = call()
        if rc < 0:
            self._pump.forget(kind, key)
            self._check(rc, what)
        return fut

    def _next_id(self) -> int:
        with self._id_lock:
            return next(self._ids)

    def _check(self, rc: int, what: str) -> None:
        check(self._lib, self._ffi, rc, what, self._engine)

