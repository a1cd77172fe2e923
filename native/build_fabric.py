"""cffi builder of the native transfer library (out-of-line API mode).

The cdef is native/fabric.h itself, minus its preprocessor lines, so the declarations exist once.
setup.py builds this as an optional extension: without libfabric the package still installs and
the transport reports the missing Debian package `libfabric-dev` when first used.
Run directly (`python native/build_fabric.py`) to build the module in place during development.
"""

from __future__ import annotations

import os
import re

from cffi import FFI

NATIVE_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT_DIR = os.path.dirname(NATIVE_DIR)
SOURCES = ["fabric.c", "fab_memory.c", "fab_submit.c", "fab_progress.c", "fab_post.c", "fab_imm.c", "fab_events.c"]
MODULE_NAME = "disaggsdk.transfer._fabric"


def header_cdef() -> str:
    """Returns fabric.h without comments and preprocessor lines: the part cffi can parse."""
    with open(os.path.join(NATIVE_DIR, "fabric.h")) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def make_ffibuilder(relative: bool = True) -> FFI:
    """The FFI builder. Source paths are relative to the repository root for setuptools."""
    base = "native" if relative else NATIVE_DIR
    ffibuilder = FFI()
    ffibuilder.cdef(header_cdef())
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
    import glob
    import shutil

    tmpdir = os.path.join(ROOT_DIR, "build", "cffi")
    built = make_ffibuilder(relative=False).compile(tmpdir=tmpdir, verbose=False)
    target = os.path.join(ROOT_DIR, "disaggsdk", "transfer")
    for old in glob.glob(os.path.join(target, "_fabric*.so")):
        os.remove(old)
    shutil.copy(built, target)
    print("built", os.path.join(target, os.path.basename(built)))
