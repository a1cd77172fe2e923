"""``disaggsdk --version -v``: the version, and where this machine's figures would come from.

Numbers differ several-fold between CPUs (AMX or not, AVX-512 or not), so a report of a figure
starts with this: the package and torch versions, the CPU (`records.host_cpu`), and which kernels
the engine picks on it. Plain ``--version`` stays argparse's one line.
"""

from __future__ import annotations

import platform

VERBOSE_FLAGS = ("-v", "--verbose")


def wants_verbose_version(argv: list[str]) -> bool:
    """Whether ``argv`` (without the program) is ``--version`` with ``-v``/``--verbose``, in any order."""
    return "--version" in argv and any(f in argv for f in VERBOSE_FLAGS) and set(argv) <= {"--version", *VERBOSE_FLAGS}


def kernel_lines() -> list[str]:
    """Which CPU kernels the engine would run here: torch's ATen build level, the native bfloat16 AMX
    linear, the native decode attention kernel (each "not available" with the reason where it is not)."""
    try:
        import torch
    except ImportError:
        return ["engine: torch is not installed (pip install 'disaggsdk[engine]')"]
    lines = [f"torch {torch.__version__}: ATen CPU kernels at {torch.backends.cpu.get_cpu_capability()}"]
    try:
        from disaggsdk.engine.modeling.layers import amx_linear

        amx = ("AMX (disaggsdk native)" if amx_linear.available()
               else "torch (no AMX tiles here, or the native kernel is not built)")
    except ImportError as exc:
        amx = f"torch (the native kernel does not load: {exc})"
    lines.append(f"bfloat16 decode linear: {amx}")
    from disaggsdk.engine.modeling.layers import wide_gemm

    wide = {"mkl": "MKL (F.linear), fixed by DISAGGSDK_WIDE_GEMM=mkl",
            "onednn": "oneDNN, fixed by DISAGGSDK_WIDE_GEMM=onednn",
            "auto": "MKL (F.linear) or oneDNN per weight shape, whichever an engine times faster at start"}[wide_gemm.MODE]
    lines.append("float32 prefill linear: " + (wide if wide_gemm.onednn_available() else "MKL (F.linear): no oneDNN here"))
    from disaggsdk.engine.attention import default_backend

    attention = default_backend("cpu", "float32", "float32")
    lines.append("attention: " + ("decode and prefill by the native kernels (cpu backend)" if attention == "cpu"
                                  else "the torch reference (the native kernel is not built)"))
    return lines


def version_text(version: str, verbose: bool) -> str:
    """``disaggsdk VERSION``, then with ``verbose`` the Python, CPU and kernel lines."""
    lines = [f"disaggsdk {version}"]
    if verbose:
        from disaggsdk.records.host_cpu import host_cpu

        lines.append(f"python {platform.python_version()} ({platform.machine()})")
        lines.append(f"cpu: {host_cpu().line()}")
        lines += kernel_lines()
    return "\n".join(lines)
