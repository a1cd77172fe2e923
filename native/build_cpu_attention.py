"""cffi builder of the CPU attention kernels (out-of-line API mode): `disaggsdk.engine.attention._cpu_kernels`.

The cdef is the headers of native/cpu_attention/ themselves, minus comments and preprocessor lines.
setup.py builds it as an optional extension (it needs only a C compiler): without it the CPU
engine uses the torch reference backend. Run directly (`python native/build_cpu_attention.py`) to
build the module in place during development.
"""

from __future__ import annotations

import os

from cffi_build import build_in_place, kernel_ffibuilder

MODULE_NAME = "disaggsdk.engine.attention._cpu_kernels"
# -ffast-math lets the dot products and sums reassociate into SIMD lanes and lets glibc's libmvec
# vectorise expf. -fopenmp: the decode kernel shares a call's work among threads. It links
# libgomp.so.1, the soname torch's wheel ships its own libgomp under, and a process holds one
# library per soname: whichever of the two loads first serves both, so the kernel runs on torch's
# thread pool (two runtimes would oversubscribe the cores). The kernel uses only
# `omp parallel` and the thread-number calls, which every libgomp has. -march=native:
# the kernels are built where they run (pip install on the machine); GCC's target_clones could not
# inline the 16-float vector helpers into the AVX-512 clone and ran 4x slower. -Wno-psabi: those
# helpers are always inlined, never called across an ABI boundary.
COMPILE_ARGS = ["-O3", "-std=gnu11", "-Wall", "-Wno-psabi", "-march=native", "-ffast-math", "-fopenmp"]


def make_ffibuilder(relative: bool = True):
    """The FFI builder. Source paths are relative to the repository root for setuptools."""
    return kernel_ffibuilder(MODULE_NAME, "cpu_attention", ["paged_decode", "causal_prefill"], COMPILE_ARGS,
                             ["mvec", "m", "gomp"], relative)


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    build_in_place(make_ffibuilder(relative=False), "cffi_cpu_attention",
                   os.path.join("disaggsdk", "engine", "attention"), "_cpu_kernels*.so")
