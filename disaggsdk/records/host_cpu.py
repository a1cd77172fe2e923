"""The CPU a figure was taken on: model, vendor, family/model ids, usable cores, and the ISA
extensions the engine's kernels choose between.

Development machines are not all one CPU (some have AMX, some are AMD Zen without it), and the
same command's numbers differ several-fold between them. So every benchmark JSON, the engine's
start-up line and ``disaggsdk --version -v`` name the CPU (docs/performance.md). Read from
/proc/cpuinfo (Linux); standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# the extensions that decide which kernels run: torch's AVX2 / AVX-512 builds, bfloat16 and int8
# dot products, and the AMX tiles the engine's bfloat16 linear uses (engine.modeling.layers.amx_linear)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class HostCpu:
    """One machine's CPU, as the kernel reports its first processor."""

    model_name: str  # "model name" (e.g. "AMD EPYC 9R45", "Intel(R) Xeon(R) Processor")
    vendor: str  # "vendor_id": GenuineIntel, AuthenticAMD
    family: int  # "cpu family"
    model: int  # "model": with the family, names a generation where the model name does not
    usable_cpus: int  # logical CPUs this process may run on (its affinity), not the machine's
    isa: tuple[str, ...]  # of ISA_FLAGS, those present, in ISA_FLAGS order

    @property
    def has_amx(self) -> bool:
        """Whether the CPU has AMX bfloat16 tiles."""
        return "amx_bf16" in self.isa

    def line(self) -> str:
        """One line for logs: model name, vendor family/model, usable CPUs and the ISA extensions."""
        isa = " ".join(self.isa) or "no AVX2"
        return (f"{self.model_name} ({self.vendor} family {self.family} model {self.model}), "
                f"{self.usable_cpus} CPUs usable; {isa}")

    def as_json(self) -> dict[str, object]:
        """The fields as a JSON object (benchmark output)."""
        return {"model_name": self.model_name, "vendor": self.vendor, "family": self.family, "model": self.model,
                "usable_cpus": self.usable_cpus, "isa": list(self.isa), "amx": self.has_amx}


def parse_cpuinfo(text: str, usable_cpus: int) -> HostCpu:
    """The first processor block of /proc/cpuinfo's ``text``.

    Args:
        text: the file's contents.
        usable_cpus: logical CPUs to report as usable.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough: every core of one machine reports the same
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())

    def number(key: str) -> int:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else -1

    return HostCpu(
        model_name=fields.get("model name", "unknown"), vendor=fields.get("vendor_id", "unknown"),
        family=number("cpu family"), model=number("model"), usable_cpus=usable_cpus,
        isa=tuple(f for f in ISA_FLAGS if f in flags),
    )


def host_cpu(cpuinfo_path: str = "/proc/cpuinfo") -> HostCpu:
    """This machine's CPU; "unknown" fields where /proc/cpuinfo cannot be read (not Linux)."""
    try:
        with open(cpuinfo_path) as f:
            text = f.read()
    except OSError:
        text = ""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)
    return parse_cpuinfo(text, usable)
