"""cffi builder of the native transfer library (out-of-line API mode).

The cdef is native/fabric.h itself, minus its preprocessor lines, so the declarations exist once.
setup.py builds this as an optional extension: without libfabric the package still installs and
the transport reports the missing Debian package `libfabric-dev` when first used.
Run directly (`python native/build_fabric.py`) to build the module in place during development.
"""

from __future__ import annotations

import os

from cffi import FFI
from cffi_build import NATIVE_DIR, build_in_place, header_cdef

SOURCES = ["fabric.c", "fab_memory.c", "fab_submit.c", "fab_progress.c", "fab_post.c", "fab_imm.c", "fab_events.c"]
MODULE_NAME = "disaggsdk.transfer._fabric"


def make_ffibuilder(relative: bool = True) -> FFI:
    """The FFI builder. Source paths are relative to the repository root for setuptools."""
    base = "native" if relative else NATIVE_DIR
    ffibuilder = FFI()
    ffibuilder.cdef(header_cdef("fabric.h"))
    ffibuilder.set_source(
        MODULE_NAME,
        '#include "fabric.h"',
        sources=[os.path.join(base, s) for s in SOURCES],
        include_dirs=[base],
        libraries=["fabric", "pthread"],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
    )
    return ffibuilder


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    build_in_place(make_ffibuilder(relative=False), "cffi", os.path.join("disaggsdk", "transfer"), "_fabric*.so")
