"""cffi builder of the CPU linear kernel (out-of-line API mode): `disaggsdk.engine.modeling.layers._amx_linear`.

The cdef is the header of native/cpu_linear/ itself, minus comments and preprocessor lines.
setup.py builds it as an optional extension (it needs only a C compiler; the AMX code is compiled
by function attributes, so any x86-64 GCC >= 11 builds it): without it, or on a CPU without AMX,
bfloat16 linears run on torch's F.linear. Run directly (`python native/build_cpu_linear.py`) to
build the module in place during development.
"""

from __future__ import annotations

import os

from cffi_build import build_in_place, kernel_ffibuilder

MODULE_NAME = "disaggsdk.engine.modeling.layers._amx_linear"
COMPILE_ARGS = ["-O2", "-std=gnu11", "-Wall", "-Wno-psabi"]


def make_ffibuilder(relative: bool = True):
    """The FFI builder. Source paths are relative to the repository root for setuptools."""
    return kernel_ffibuilder(MODULE_NAME, "cpu_linear", ["amx_linear"], COMPILE_ARGS, [], relative)


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    build_in_place(make_ffibuilder(relative=False), "cffi_cpu_linear",
                   os.path.join("disaggsdk", "engine", "modeling", "layers"), "_amx_linear*.so")
