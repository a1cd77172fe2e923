"""Same-host direct writes: where a target region lives in shared memory (a memfd), an initiator
on the same machine maps it and copies with memcpy instead of asking libfabric's shm provider,
whose kernel copy (process_vm_readv, run by the target's progress thread, one write at a time)
tops out near 0.6x memcpy here (native/README.md). The immediates still travel through
libfabric, as zero-length writes carrying entry counts, so targets count as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import struct
from functools import lru_cache

import attrs

from disaggsdk.transfer.errors import TransferError

_SHARE_FORMAT = struct.Struct("<16s6Q")  # host id, pid, fd, offset, device, inode, check


# What "one host" means for a same-host path: the same kernel (boot id), the same network
# namespace, the same mount namespace (whose /dev/shm and /proc the initiator opens) and the same
# pid namespace (the share names the target by pid). Containers and the testbed's nodes share the
# kernel's boot id but not these, and must not take the path.
_NAMESPACES = ("net", "mnt", "pid")


@lru_cache(maxsize=1)
def host_id() -> bytes:
    """16 bytes naming this host as a same-host path sees it: this boot of the kernel and this
    process's network, mount and pid namespaces (two containers, or two testbed nodes, on one
    machine get different ids). All zeros where they cannot be read: never equal to a real id, so
    no direct path."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = bytes.fromhex(f.read().strip().replace("-", ""))
        namespaces = [os.stat(f"/proc/self/ns/{name}") for name in _NAMESPACES]
    except (OSError, ValueError):
        return b"\0" * 16
    identity = boot_id + b"".join(struct.pack("<QQ", st.st_dev, st.st_ino) for st in namespaces)
    return hashlib.blake2b(identity, digest_size=16).digest()


@attrs.frozen
class SameHostShare:
    """Where a registered region can be mapped from on its own machine."""

    host: bytes  # host_id() of the target's machine
    pid: int
    fd: int  # the target's descriptor of the shared-memory file
    offset: int  # of byte 0 of the region in that file
    device: int  # st_dev and st_ino of the file: the initiator checks it opened the same one
    inode: int

    @classmethod
    def of_fd(cls, fd: int, offset: int = 0) -> SameHostShare:
        """Describe byte ``offset`` of this process's shared-memory file ``fd``."""
        st = os.fstat(fd)
        return cls(host_id(), os.getpid(), fd, offset, st.st_dev, st.st_ino)

    def _check(self) -> int:
        fields = struct.pack("<16s5Q", self.host, self.pid, self.fd, self.offset, self.device, self.inode)
        return int.from_bytes(hashlib.blake2b(fields, digest_size=8).digest(), "little")

    def to_bytes(self) -> bytes:
        return _SHARE_FORMAT.pack(self.host, self.pid, self.fd, self.offset, self.device, self.inode,
                                  self._check())

    @classmethod
    def from_bytes(cls, data: bytes) -> SameHostShare | None:
        """Parse; all zeros means none. Raises TransferError on a corrupted block."""
        if not any(data):
            return None
        *fields, check = _SHARE_FORMAT.unpack(data)
        share = cls(*fields)
        if share._check() != check:
            raise TransferError("the region descriptor's same-host block fails its check (corrupted or edited): "
                                "use the descriptor exactly as the target's register() made it")
        return share

    @staticmethod
    def empty_bytes() -> bytes:
        return bytes(_SHARE_FORMAT.size)


class PeerMapping:
    """A peer's shared region mapped into this process (read-write), until `close`."""

    def __init__(self, share: SameHostShare, length_bytes: int):
        if share.host != host_id():
            raise TransferError("the region lives on another machine")
        path = f"/proc/{share.pid}/fd/{share.fd}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise TransferError(f"cannot open the peer's shared memory {path}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (share.device, share.inode):
                raise TransferError(f"{path} is no longer the region's shared-memory file (the process exited?)")
            if st.st_size < share.offset + length_bytes:
                raise TransferError(f"{path} holds {st.st_size} bytes, the region needs "
                                    f"{share.offset + length_bytes}")
            start = share.offset - share.offset % mmap.ALLOCATIONGRANULARITY
            # populated now: the first copy into each page must not pay a page fault
            mapped = mmap.mmap(fd, share.offset + length_bytes - start, mmap.MAP_SHARED | mmap.MAP_POPULATE,
                               mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        finally:
            os.close(fd)  # the mapping keeps the file alive
        self._mmap: mmap.mmap | None = mapped  # None once closed
        self._anchor = ctypes.c_char.from_buffer(mapped)
        self.address = ctypes.addressof(self._anchor) + (share.offset - start)  # byte 0 of the region

    def close(self) -> None:
        """Unmap; the native engine must no longer use the address."""
        if self._mmap is not None:
            del self._anchor
            self._mmap.close()
            self._mmap = None
