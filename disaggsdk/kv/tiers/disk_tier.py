"""The disk tier: one file per page entry in a directory, a byte budget, evicted least recently used.

Each file is the entry padded with zeros to a multiple of 4096 bytes (the entry's header keeps its
true length), written under a temporary name and renamed, so a crash never leaves half an entry
under a key. The index is rebuilt from the directory when a tier opens it, least recently used by
file mtime: a restarted unit finds its pages again. A failed read or write counts an error and is a
miss or a dropped write, never an exception. One `DiskTier` per directory at a time.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

from disaggsdk.kv.tiers.base import TierConfigError, TierCounters
from disaggsdk.kv.tiers.page_entry import MIN_HEADER_BYTES, CorruptPageError, entry_size

BLOCK_BYTES = 4096  # files are whole blocks of this size
WRITE_CHUNK_BYTES = 256 * BLOCK_BYTES  # one os.write at most this much
ENTRY_SUFFIX = ".kvpage"
TEMP_SUFFIX = ".tmp"
KEY_PATTERN = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]{0,199}")  # a file name on any filesystem


def padded_bytes(num_bytes: int) -> int:
    """``num_bytes`` rounded up to whole `BLOCK_BYTES` blocks (the size of an entry's file)."""
    return -(-num_bytes // BLOCK_BYTES) * BLOCK_BYTES


class DiskTier:
    """Entries as files under ``path`` (a `base.KVTier`).

    Args:
        path: the directory (created if missing); entries already there are found again.
        capacity_bytes: the most bytes of files it keeps (each file in whole 4096-byte blocks).
    Raises:
        TierConfigError: ``capacity_bytes`` below 0, or ``path`` cannot be made a directory.
    """

    name = "disk"

    def __init__(self, path: str | os.PathLike[str], capacity_bytes: int):
        if capacity_bytes < 0:
            raise TierConfigError(f"the disk tier's capacity_bytes must be >= 0, got {capacity_bytes}")
        self.path = Path(path)
        self.capacity_bytes = capacity_bytes
        self.counters = TierCounters()
        self._files: OrderedDict[str, int] = OrderedDict()  # key -> file bytes, least recently used first
        self._used_bytes = 0
        self._last_mtime_ns = 0  # the latest mtime `_stamp` set
        self._lock = threading.RLock()  # the engine thread reads while the stack's writer thread writes
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._rebuild_index()
        except OSError as exc:
            raise TierConfigError(f"the disk tier cannot use {self.path}: {exc.strerror or exc}; "
                                  "give a writable directory") from None

    @property
    def used_bytes(self) -> int:
        """Bytes of the entries' files now."""
        return self._used_bytes

    def contains(self, key: str) -> bool:
        """Whether the index holds ``key`` (no I/O, counts nothing)."""
        return key in self._files

    def get(self, key: str) -> bytes | None:
        """The entry under ``key`` without its padding (now the most recently used), or None."""
        with self._lock:
            if key not in self._files:
                self.counters.misses += 1
                return None
            self._files.move_to_end(key)
        raw = self._read(key)
        with self._lock:
            self.counters.count_get(raw)
        if raw is not None:
            self._stamp(key)
        return raw

    def put(self, key: str, raw: bytes) -> list[tuple[str, bytes]]:
        """Write ``raw`` as the file of ``key`` (replacing it), the most recently used entry.

        Returns:
            the entries evicted to make room (their files deleted), least recently used first;
            ``[(key, raw)]`` when ``raw``'s file would be bigger than the capacity. A failed write
            counts an error and a dropped write and returns ``[]``.
        """
        self._check_key(key)
        file_bytes = padded_bytes(len(raw))
        if file_bytes > self.capacity_bytes:
            self.discard(key)
            return [(key, raw)]
        temp = self.path / f".{key}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
        try:
            self._write(temp, raw, file_bytes)
        except OSError:
            self._unlink(temp)
            with self._lock:
                self.counters.errors += 1
                self.counters.dropped_writes += 1
            return []
        with self._lock:
            try:
                os.replace(temp, self._file(key))
            except OSError:
                self.counters.errors += 1
                self.counters.dropped_writes += 1
                self._unlink(temp)
                return []
            self._used_bytes -= self._files.pop(key, 0)
            victims = []
            while self._used_bytes + file_bytes > self.capacity_bytes:
                old_key, old_bytes = self._files.popitem(last=False)
                self._used_bytes -= old_bytes
                victims.append(old_key)
            self._files[key] = file_bytes
            self._used_bytes += file_bytes
            self.counters.bytes_written += len(raw)
            self.counters.evictions += len(victims)
            self._stamp(key)
        evicted = []
        for old_key in victims:  # read for the next tier down, outside the lock: a get meanwhile is a miss
            old_raw = self._read(old_key)
            self._unlink(self._file(old_key))
            if old_raw is not None:
                evicted.append((old_key, old_raw))
        return evicted

    def discard(self, key: str) -> None:
        """Delete the file of ``key`` if there is one."""
        with self._lock:
            self._used_bytes -= self._files.pop(key, 0)
        if KEY_PATTERN.fullmatch(key):
            self._unlink(self._file(key))

    def clear(self) -> None:
        """Delete every entry's file (a reset: the unit forgets what it kept)."""
        with self._lock:
            keys = list(self._files)
        for key in keys:
            self.discard(key)

    def close(self) -> None:
        """Nothing to release: the files stay for the next tier opened on this directory."""

    def _stamp(self, key: str) -> None:
        """Set the file's mtime to a time later than any this tier set before: the LRU order a
        restart rebuilds (the filesystem's own clock may give two writes in a row one time)."""
        with self._lock:
            self._last_mtime_ns = max(time.time_ns(), self._last_mtime_ns + 1)
            stamp_ns = self._last_mtime_ns
        try:
            os.utime(self._file(key), ns=(stamp_ns, stamp_ns))
        except OSError:
            pass  # gone since, or a read-only mount: the order in memory stays right

    def _file(self, key: str) -> Path:
        return self.path / f"{key}{ENTRY_SUFFIX}"

    @staticmethod
    def _check_key(key: str) -> None:
        if not KEY_PATTERN.fullmatch(key):
            raise TierConfigError(f"a disk tier key must match {KEY_PATTERN.pattern} (a safe file name), got {key!r}")

    def _read(self, key: str) -> bytes | None:
        """The entry in ``key``'s file, cut at the length its header gives; None (an error counted
        unless the file is gone) when it cannot be read. A file whose header is unreadable comes
        back whole: the reader's `decode_entry` refuses it and says why."""
        try:
            with open(self._file(key), "rb", buffering=0) as f:
                head = f.read(MIN_HEADER_BYTES)
                try:
                    size = entry_size(head)
                except CorruptPageError:
                    size = -1
                f.seek(0)
                return f.readall() if size < 0 else f.read(size)
        except FileNotFoundError:  # evicted since the index was read, or deleted by someone else
            with self._lock:
                self._used_bytes -= self._files.pop(key, 0)
            return None
        except OSError:
            with self._lock:
                self.counters.errors += 1
            return None

    @staticmethod
    def _write(temp: Path, raw: bytes, file_bytes: int) -> None:
        """``raw`` then zeros to ``file_bytes``, in chunks of whole blocks."""
        view = memoryview(raw).cast("B")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            tail = bytes(file_bytes - view.nbytes)
            offset = 0
            while offset < view.nbytes:
                offset += os.write(fd, view[offset : offset + WRITE_CHUNK_BYTES])
            written = 0
            while written < len(tail):
                written += os.write(fd, tail[written:])
        finally:
            os.close(fd)

    def _unlink(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            with self._lock:
                self.counters.errors += 1

    def _rebuild_index(self) -> None:
        """The entries already in the directory, by mtime; temporary files a crash left are deleted,
        and the least recently used entries beyond the capacity."""
        found = []
        for item in os.scandir(self.path):
            if item.name.endswith(TEMP_SUFFIX):
                self._unlink(Path(item.path))
            elif item.name.endswith(ENTRY_SUFFIX) and item.is_file(follow_symlinks=False):
                stat = item.stat(follow_symlinks=False)
                found.append((stat.st_mtime_ns, item.name.removesuffix(ENTRY_SUFFIX), stat.st_size))
        self._last_mtime_ns = max((mtime for mtime, _, _ in found), default=0)
        for _, key, size in sorted(found):
            self._files[key] = size
            self._used_bytes += size
        while self._used_bytes > self.capacity_bytes:
            old_key, old_bytes = self._files.popitem(last=False)
            self._used_bytes -= old_bytes
            self.counters.evictions += 1
            self._unlink(self._file(old_key))
