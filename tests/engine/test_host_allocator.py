"""glibc malloc settings of a CPU engine: applied where nothing else chose, left alone otherwise."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from disaggsdk.engine import host_allocator
from disaggsdk.engine.host_allocator import keep_freed_memory


def _on_glibc() -> bool:
    return platform.system() == "Linux" and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.fixture
def calls(monkeypatch) -> list[tuple[int, int]]:
    """mallopt's calls, recorded and not made (the test process keeps its own malloc settings)."""
    made: list[tuple[int, int]] = []

    class Libc:
        def gnu_get_libc_version(self) -> bytes:
            return b"2.36"

        def mallopt(self, param: int, value: int) -> int:
            made.append((param, value))
            return 1

    monkeypatch.setattr(host_allocator.ctypes, "CDLL", lambda name: Libc())
    for name in (*host_allocator.USER_SETTING_ENVS, "LD_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    return made


def test_glibc_keeps_steps_buffers_in_the_heap(calls):
    """Buffers up to 32 MiB from the heap, and the heap's free top kept up to 1 GiB."""
    assert keep_freed_memory()
    assert calls == [(host_allocator.M_MMAP_THRESHOLD, 32 << 20), (host_allocator.M_TRIM_THRESHOLD, 1 << 30)]


@pytest.mark.parametrize(("env", "value"), [("MALLOC_TRIM_THRESHOLD_", "131072"),
                                            ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536"),
                                            ("LD_PRELOAD", "/usr/lib/libtcmalloc_minimal.so.4")])
def test_the_users_own_allocator_settings_win(calls, monkeypatch, env, value):
    """glibc's variables set by the user, or another allocator preloaded: nothing changed."""
    monkeypatch.setenv(env, value)
    assert not keep_freed_memory()
    assert calls == []


@pytest.mark.skipif(not _on_glibc(), reason="glibc's mallopt")
def test_the_real_mallopt_accepts_the_settings():
    """In a child process (the settings are process-wide): glibc takes both values."""
    code = "from disaggsdk.engine.host_allocator import keep_freed_memory; raise SystemExit(0 if keep_freed_memory() else 1)"
    env = {k: v for k, v in os.environ.items()
           if k not in (*host_allocator.USER_SETTING_ENVS, "LD_PRELOAD")}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0
