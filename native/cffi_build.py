"""What the cffi builders of native/ share: a header as cdef, and the in-place development build."""

from __future__ import annotations

import glob
import os
import re
import shutil
from typing import Any

NATIVE_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT_DIR = os.path.dirname(NATIVE_DIR)


def header_cdef(*headers: str) -> str:
    """The headers (paths relative to native/) without comments and preprocessor lines: the part
    cffi can parse, so each declaration is written once, in its header."""
    text = ""
    for header in headers:
        with open(os.path.join(NATIVE_DIR, header)) as f:
            text += f.read() + "\n"
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def kernel_ffibuilder(module_name: str, directory: str, names: list[str], compile_args: list[str],
                      libraries: list[str], relative: bool) -> Any:
    """The FFI builder of a kernel module: the C files ``directory/NAME.c`` of each name, their
    headers as the cdef (and the module's includes). Source paths are relative to the repository
    root for setuptools (``relative``), absolute for an in-place build."""
    from cffi import FFI

    base = "native" if relative else NATIVE_DIR
    ffibuilder = FFI()
    ffibuilder.cdef(header_cdef(*[f"{directory}/{n}.h" for n in names]))
    ffibuilder.set_source(
        module_name,
        "\n".join(f'#include "{n}.h"' for n in names),
        sources=[os.path.join(base, directory, f"{n}.c") for n in names],
        include_dirs=[os.path.join(base, directory)],
        libraries=libraries,
        extra_compile_args=compile_args,
    )
    return ffibuilder


def build_in_place(ffibuilder: Any, tmp_name: str, package_dir: str, module_glob: str) -> None:
    """Compile ``ffibuilder`` under build/``tmp_name`` and replace the module in ``package_dir``
    (relative to the repository root) for development, as `pip install -e .` would."""
    built = ffibuilder.compile(tmpdir=os.path.join(ROOT_DIR, "build", tmp_name), verbose=False)
    target = os.path.join(ROOT_DIR, package_dir)
    for old in glob.glob(os.path.join(target, module_glob)):
        os.remove(old)
    shutil.copy(built, target)
    print("built", os.path.join(target, os.path.basename(built)))
