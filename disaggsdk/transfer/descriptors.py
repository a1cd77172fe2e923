"""Values that go to a peer (serializable, no pickle) and the local handles that own resources."""

from __future__ import annotations

import ctypes
import struct
from array import array
from collections.abc import Iterable, Sequence

import attrs

from disaggsdk.transfer.errors import TransferError
from disaggsdk.transfer.same_host import SameHostShare

# magic, version, the fields of fab_region_desc (native/fabric.h), then the same-host block
# (all zeros when the region cannot be mapped by a peer; see same_host.py)
_REGION_FORMAT = struct.Struct("<4sH2x5Q")
_REGION_MAGIC = b"DKRD"
_REGION_VERSION = 2


@attrs.frozen
class RegionDescriptor:
    """What a peer needs to write into a registered region; goes over the wire as bytes.

    The address arithmetic (virtual address or offset, per the provider's mr_mode) is the
    native library's business: writers only give offsets into the region.
    """

    addr_base: int  # remote address of byte 0 (a virtual address, or 0 for offset addressing)
    key: int
    length_bytes: int
    mr_mode: int
    check: int  # computed by the target's library; the initiator refuses a mismatch
    same_host: SameHostShare | None = None  # where a peer on this machine can map the region

    def to_bytes(self) -> bytes:
        """Returns the wire form (`wire_bytes()` long)."""
        share = self.same_host.to_bytes() if self.same_host else SameHostShare.empty_bytes()
        return _REGION_FORMAT.pack(_REGION_MAGIC, _REGION_VERSION, self.addr_base, self.key,
                                   self.length_bytes, self.mr_mode, self.check) + share

    @staticmethod
    def wire_bytes() -> int:
        """Length of `to_bytes()`."""
        return _REGION_FORMAT.size + len(SameHostShare.empty_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> RegionDescriptor:
        """Parses the wire form.

        Raises:
            TransferError: wrong size, magic or version.
        """
        if len(data) != cls.wire_bytes():
            raise TransferError(f"a region descriptor is {cls.wire_bytes()} bytes, got "
                                f"{len(data)}: pass RegionDescriptor.to_bytes() output unchanged")
        magic, version, addr_base, key, length_bytes, mr_mode, check = _REGION_FORMAT.unpack(data[:_REGION_FORMAT.size])
        if magic != _REGION_MAGIC or version != _REGION_VERSION:
            raise TransferError(f"not a version-{_REGION_VERSION} region descriptor "
                                f"(magic {magic!r}, version {version}): peers run different "
                                "disaggsdk versions?")
        return cls(addr_base, key, length_bytes, mr_mode, check,
                   same_host=SameHostShare.from_bytes(data[_REGION_FORMAT.size:]))


@attrs.frozen
class Peer:
    """A peer endpoint inserted into this engine's address vector (local handle)."""

    handle: int
    address: bytes


@attrs.frozen(eq=False)
class MemoryRegion:
    """A local registration: owns the native handle; `descriptor` is what peers get."""

    handle: int
    address: int  # local virtual address of byte 0
    length_bytes: int
    descriptor: RegionDescriptor
    keepalive: object = attrs.field(repr=False)  # the buffer or its cffi view: must outlive `handle`
    cuda_device: int | None = None  # the CUDA device ordinal of device memory (FI_HMEM_CUDA); None: host

    def view(self) -> memoryview:
        """The region's bytes, read in place (host memory only: a CUDA region cannot be read here).

        Valid while the registered memory stays mapped; nothing is copied.
        """
        return memoryview((ctypes.c_char * self.length_bytes).from_address(self.address)).cast("B")


def _u64(values: int | Iterable[int], n: int | None) -> array[int]:
    if isinstance(values, int):
        if n is None:
            raise TransferError("a scalar length needs offsets to size the batch")
        return array("Q", [values]) * n
    return values if isinstance(values, array) and values.typecode == "Q" else array("Q", values)


@attrs.frozen
class WriteBatch:
    """A batch of writes from one local region into one peer region.

    Entry i copies lengths[i] bytes from src offset src_offsets[i] to dst offset dst_offsets[i]
    and carries immediate imms[i] (32 bits). Entries contiguous on both sides with the same
    immediate travel as one write; immediate counts stay in entries.
    """

    src: MemoryRegion
    dst: RegionDescriptor
    src_offsets: array = attrs.field(converter=lambda v: _u64(v, None))  # [n], uint64
    dst_offsets: array = attrs.field(converter=lambda v: _u64(v, None))  # [n], uint64
    lengths: array  # [n], uint64
    imms: array  # [n], uint32

    def __attrs_post_init__(self) -> None:
        n = len(self.src_offsets)
        if len(self.dst_offsets) != n or len(self.lengths) != n or len(self.imms) != n:
            raise TransferError(f"a write batch needs as many dst offsets, lengths and imms as "
                                f"src offsets ({n}); got {len(self.dst_offsets)}, "
                                f"{len(self.lengths)}, {len(self.imms)}")

    @classmethod
    def of(cls, src: MemoryRegion, dst: RegionDescriptor, src_offsets: Sequence[int],
           dst_offsets: Sequence[int], lengths: Sequence[int] | int,
           imms: Sequence[int] | int) -> WriteBatch:
        """Builds a batch; a scalar length or immediate applies to every entry.

        Raises:
            TransferError: the sequences differ in length, or an immediate exceeds 32 bits.
        """
        n = len(src_offsets)
        try:
            imm_arr = array("I", [imms]) * n if isinstance(imms, int) else array("I", imms)
        except OverflowError as exc:
            raise TransferError(f"immediates are 32-bit unsigned: {exc}") from exc
        return cls(src, dst, src_offsets, dst_offsets, _u64(lengths, n), imm_arr)

    @classmethod
    def pages(cls, src: MemoryRegion, dst: RegionDescriptor, src_pages: Sequence[int],
              dst_pages: Sequence[int], page_bytes: int, imm: int) -> WriteBatch:
        """Whole-page writes: src page src_pages[i] to dst page dst_pages[i], all with `imm`."""
        return cls.of(src, dst, [p * page_bytes for p in src_pages],
                      [p * page_bytes for p in dst_pages], page_bytes, imm)

    def __len__(self) -> int:
        return len(self.src_offsets)
