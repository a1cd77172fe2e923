"""The one door to native code: loads the cffi module on first use."""

from __future__ import annotations

import functools
from typing import Any

from disaggsdk.transfer.errors import NativeLibraryMissing, TransferError

_MODULE = "disaggsdk.transfer._fabric"


@functools.cache
def load_native() -> tuple[Any, Any]:
    """Imports the compiled fabric-lib module.

    Returns:
        (ffi, lib) of the cffi module `disaggsdk.transfer._fabric`.

    Raises:
        NativeLibraryMissing: the module was not built (no libfabric headers at install time) or
            libfabric.so cannot be loaded; the message says how to fix it.
    """
    try:
        from disaggsdk.transfer import _fabric
    except ImportError as exc:
        if exc.name in ("_cffi_backend", "cffi"):  # the module is built; the Python package it loads with is not
            raise NativeLibraryMissing(
                f"the native transfer library needs cffi ({exc}): pip install 'disaggsdk[transfer]'") from exc
        raise NativeLibraryMissing(
            "the native transfer library (disaggsdk.transfer._fabric) is not available "
            f"({exc}). Install libfabric with the Debian package libfabric-dev "
            "(`apt-get install libfabric-dev`), then rebuild disaggsdk (`pip install -e .` or "
            "`make install`)."
        ) from exc
    return _fabric.ffi, _fabric.lib


def check(lib: Any, ffi: Any, rc: int, what: str, engine: Any = None) -> None:
    """Raises TransferError for a negative return code of a fabric-lib call.

    Args:
        lib, ffi: the loaded native module.
        rc: the call's return code (0 or a negative libfabric errno).
        what: what was being done, for the message.
        engine: the fab_engine pointer whose last error message adds detail, if any.

    Raises:
        TransferError: rc < 0, with fi_strerror text and the library's detail.
    """
    if rc >= 0:
        return
    reason = ffi.string(lib.fab_strerror(rc)).decode(errors="replace")
    detail = ffi.string(lib.fab_last_error(engine if engine is not None else ffi.NULL))
    detail = detail.decode(errors="replace")
    raise TransferError(f"{what}: {reason} ({rc})" + (f": {detail}" if detail else ""))
