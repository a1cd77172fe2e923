"""cffi builder of the CPU attention kernels (out-of-line API mode): `disaggsdk.engine.attention._cpu_kernels`.

The cdef is native/cpu_attention/paged_decode.h itself, minus comments and preprocessor lines.
setup.py builds it as an optional extension (it needs only a C compiler): without it the CPU
engine uses the torch reference backend. Run directly (`python native/build_cpu_attention.py`) to
build the module in place during development.
"""

from __future__ import annotations

import os
import re

from cffi import FFI

NATIVE_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT_DIR = os.path.dirname(NATIVE_DIR)
SOURCES = ["cpu_attention/paged_decode.c"]
HEADER = "cpu_attention/paged_decode.h"
MODULE_NAME = "disaggsdk.engine.attention._cpu_kernels"
# -ffast-math lets the dot products and sums reassociate into SIMD lanes and lets glibc's libmvec
# vectorise expf; -fopenmp-simd honours the `omp simd` pragmas without linking an OpenMP runtime
# (torch brings its own, and two runtimes in one process oversubscribe the cores).
COMPILE_ARGS = ["-O3", "-std=gnu11", "-Wall", "-ffast-math", "-fopenmp-simd"]


def header_cdef() -> str:
    """The header without comments and preprocessor lines: the part cffi can parse."""
    with open(os.path.join(NATIVE_DIR, HEADER)) as f:
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
        '#include "paged_decode.h"',
        sources=[os.path.join(base, s) for s in SOURCES],
        include_dirs=[os.path.join(base, "cpu_attention")],
        libraries=["mvec", "m"],
        extra_compile_args=COMPILE_ARGS,
    )
    return ffibuilder


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    import glob
    import shutil

    tmpdir = os.path.join(ROOT_DIR, "build", "cffi_cpu_attention")
    built = make_ffibuilder(relative=False).compile(tmpdir=tmpdir, verbose=False)
    target = os.path.join(ROOT_DIR, "disaggsdk", "engine", "attention")
    for old in glob.glob(os.path.join(target, "_cpu_kernels*.so")):
        os.remove(old)
    shutil.copy(built, target)
    print("built", os.path.join(target, os.path.basename(built)))
