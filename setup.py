"""Build hook: everything lives in pyproject.toml; the native libraries are added here.

The extension `disaggsdk.transfer._fabric` (native/*.c over libfabric, via cffi) is optional:
where libfabric's headers are missing, or the compile fails, the package installs without it
and `disaggsdk.transfer` raises a TransferError naming the Debian package `libfabric-dev`.
The extension `disaggsdk.engine.attention._cpu_kernels` (native/cpu_attention/, the CPU decode
attention kernel) needs only a C compiler; it is optional too: without it the CPU engine runs the
torch reference attention. So is `disaggsdk.engine.modeling.layers._amx_linear` (native/cpu_linear/,
the bfloat16 AMX matmul of decode steps): without it bfloat16 linears run on torch's F.linear.
"""

import os
import sys

from setuptools import setup


def fabric_extensions():
    """The cffi extension, or nothing where libfabric (headers) cannot be found."""
    include_dirs = ["/usr/include", "/usr/local/include"] + os.environ.get("CPATH", "").split(":")
    if not any(os.path.exists(os.path.join(d, "rdma", "fabric.h")) for d in include_dirs if d):
        print("disaggsdk: libfabric headers not found (apt-get install libfabric-dev); "
              "building without the native transfer library", file=sys.stderr)
        return []
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
    from build_fabric import make_ffibuilder

    ext = make_ffibuilder().distutils_extension(tmpdir="build/cffi")
    ext.optional = True  # a failed compile warns instead of failing the install
    return [ext]


def cpu_kernel_extensions():
    """The CPU attention kernels' and the AMX linear's cffi extensions (optional: a failed compile warns)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
    import build_cpu_attention
    import build_cpu_linear

    extensions = []
    for builder, tmpdir in ((build_cpu_attention, "build/cffi_cpu_attention"), (build_cpu_linear, "build/cffi_cpu_linear")):
        ext = builder.make_ffibuilder().distutils_extension(tmpdir=tmpdir)
        ext.optional = True
        extensions.append(ext)
    return extensions


setup(ext_modules=fabric_extensions() + cpu_kernel_extensions())
