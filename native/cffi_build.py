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


def build_in_place(ffibuilder: Any, tmp_name: str, package_dir: str, module_glob: str) -> None:
    """Compile ``ffibuilder`` under build/``tmp_name`` and replace the module in ``package_dir``
    (relative to the repository root) for development, as `pip install -e .` would."""
    built = ffibuilder.compile(tmpdir=os.path.join(ROOT_DIR, "build", tmp_name), verbose=False)
    target = os.path.join(ROOT_DIR, package_dir)
    for old in glob.glob(os.path.join(target, module_glob)):
        os.remove(old)
    shutil.copy(built, target)
    print("built", os.path.join(target, os.path.basename(built)))
