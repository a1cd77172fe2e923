"""cffi builder of the CPU attention kernels (out-of-line API mode): `disaggsdk.engine.attention._cpu_kernels`.

The cdef is the headers of native/cpu_attention/ themselves, minus comments and preprocessor lines.
setup.py builds it as an optional extension (it needs only a C compiler): without it the CPU
engine uses the torch reference backend. Run directly (`python native/build_cpu_attention.py`) to
build the module in place during development.
"""

from __future__ import annotations

import os

from cffi import FFI
from cffi_build import NATIVE_DIR, build_in_place, header_cdef

SOURCES = ["cpu_attention/paged_decode.c", "cpu_attention/causal_prefill.c"]
HEADERS = ["cpu_attention/paged_decode.h", "cpu_attention/causal_prefill.h"]
MODULE_NAME = "disaggsdk.engine.attention._cpu_kernels"
# -ffast-math lets the dot products and sums reassociate into SIMD lanes and lets glibc's libmvec
# vectorise expf; -fopenmp-simd honours the `omp simd` pragmas without linking an OpenMP runtime
# (torch brings its own, and two runtimes in one process oversubscribe the cores). -march=native:
# the kernels are built where they run (pip install on the machine); GCC's target_clones could not
# inline the 16-float vector helpers into the AVX-512 clone and ran 4x slower. -Wno-psabi: those
# helpers are always inlined, never called across an ABI boundary.
COMPILE_ARGS = ["-O3", "-std=gnu11", "-Wall", "-Wno-psabi", "-march=native", "-ffast-math", "-fopenmp-simd"]


def make_ffibuilder(relative: bool = True) -> FFI:
    """The FFI builder. Source paths are relative to the repository root for setuptools."""
    base = "native" if relative else NATIVE_DIR
    ffibuilder = FFI()
    ffibuilder.cdef(header_cdef(*HEADERS))
    ffibuilder.set_source(
        MODULE_NAME,
        '#include "paged_decode.h"\n#include "causal_prefill.h"',
        sources=[os.path.join(base, s) for s in SOURCES],
        include_dirs=[os.path.join(base, "cpu_attention")],
        libraries=["mvec", "m"],
        extra_compile_args=COMPILE_ARGS,
    )
    return ffibuilder


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    build_in_place(make_ffibuilder(relative=False), "cffi_cpu_attention",
                   os.path.join("disaggsdk", "engine", "attention"), "_cpu_kernels*.so")
