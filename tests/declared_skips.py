"""The only reasons a test may skip: what the machine is, never what was not installed or built.

`make test` installs every extra, system package and native kernel the suite needs, so a skip for
a missing package, a kernel that failed to compile or a tool that is not on PATH hides a broken
install behind a green run (a broken native build once turned into 40 skips). The conftest guard
(`tests/conftest.py`) fails the run on any skip whose reason does not start with one of the
prefixes below, and prints every skip reason in the run's last lines.

Each helper returns the reason text; use it as ``pytest.skip(no_gpu("..."))`` or
``pytest.mark.skipif(cond, reason=no_gpu("..."))``.
"""

from __future__ import annotations

# prefix -> what it declares; the guard accepts a skip whose reason starts with one of them
NO_GPU = "no GPU: "
GPU_PRESENT = "a GPU is present: "
NO_RDMA = "no RDMA device: "
NOT_ROOT = "not root: "
CPU_LACKS = "this CPU lacks "
KERNEL_VARIANT = "this kernel "

DECLARED_PREFIXES: dict[str, str] = {
    NO_GPU: "the test needs an NVIDIA GPU (or more of them) this machine does not have",
    GPU_PRESENT: "the test checks what a machine without a GPU does",
    NO_RDMA: "the test needs an RDMA NIC (verbs, efa) this machine does not have",
    NOT_ROOT: "the test needs root (network namespaces) and runs without it",
    CPU_LACKS: "the test needs a CPU feature (AMX) this CPU does not have",
    KERNEL_VARIANT: "the test covers the other branch of a kernel feature (sch_netem present or not)",
}


def no_gpu(detail: str) -> str:
    """A test of GPU hardware, on a machine without it (``detail``: what it needs)."""
    return f"{NO_GPU}{detail}"


def gpu_present(detail: str) -> str:
    """A test of what a machine without a GPU does, on a machine with one."""
    return f"{GPU_PRESENT}{detail}"


def no_rdma(detail: str) -> str:
    """A test of an RDMA provider, on a machine without the device."""
    return f"{NO_RDMA}{detail}"


def not_root(detail: str) -> str:
    """A test that needs root (or the capabilities root has), run without them."""
    return f"{NOT_ROOT}{detail}"


def cpu_lacks(feature: str, detail: str) -> str:
    """A test of a CPU feature (``feature``: "AMX") this CPU does not have."""
    return f"{CPU_LACKS}{feature}: {detail}"


def kernel_variant(detail: str) -> str:
    """One branch of a kernel feature that this kernel takes the other way (``detail`` starts with
    "has" or "lacks": "has sch_netem, which ...")."""
    return f"{KERNEL_VARIANT}{detail}"


def is_declared(reason: str) -> bool:
    """Whether a skip ``reason`` (pytest's text, with or without its "Skipped: " head) is declared."""
    text = reason.removeprefix("Skipped: ")
    return text.startswith(tuple(DECLARED_PREFIXES))
