"""Kernel times from the measured tables where they answer and the roofline where they do not, with the account.

`LayeredKernels` asks its tables (`table_kernels.TableKernels`) for each kernel and, where they answer
None, the roofline (`roofline_kernels.RooflineKernels`), so every call gets a time. It counts, per kernel
kind, which source answered and how (exact, interpolated, extrapolated, roofline): `sources` is what a
simulation's output reports. `kernel_costs_for` builds one for a hardware profile from the database its
profile names (``kernel_db``), or the roofline alone where the profile names none or the tables cannot
be read (then with a one-line warning that says why and what to install).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.sim.kernel_db import KernelDb, KernelDbRef, KernelDbUnavailable
from disaggsdk.sim.kernels import Attention, Collective, Elementwise, Fit, Gemm, Kernel, KernelCosts, KernelTime, MoeExperts
from disaggsdk.sim.roofline_kernels import RooflineKernels

FITS: tuple[Fit, ...] = ("exact", "interpolated", "extrapolated", "roofline")
MEMO_SIZE = 1 << 16  # kernel shapes remembered before the memo starts afresh (a step repeats its shapes)

S = TypeVar("S", bound=Kernel)


class LayeredKernels:
    """`kernels.CompleteKernelCosts`: ``tables`` first (None: none), ``roofline`` for what they do not cover."""

    def __init__(self, tables: KernelCosts | None, roofline: RooflineKernels, notes: Sequence[str] = ()) -> None:
        """
        Args:
            tables: the measured source, or None for the roofline alone.
            roofline: the fallback; it answers every shape.
            notes: what a reader of the sources should know (why there are no tables, ...).
        """
        self.tables = tables
        self.roofline = roofline
        self.notes = tuple(notes)
        self._counts: dict[str, Counter[tuple[str, Fit]]] = {}
        self._memo: dict[Kernel, KernelTime] = {}

    def _answer(self, shape: S, measured: Callable[[S], KernelTime | None] | None,
                fallback: Callable[[S], KernelTime]) -> KernelTime:
        time = self._memo.get(shape)
        if time is None:
            time = measured(shape) if measured is not None else None
            if time is None:
                time = fallback(shape)
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[shape] = time
        self._counts.setdefault(shape.kind, Counter())[(time.source, time.fit)] += 1
        return time

    def gemm(self, shape: Gemm) -> KernelTime:
        return self._answer(shape, self.tables.gemm if self.tables else None, self.roofline.gemm)

    def attention(self, shape: Attention) -> KernelTime:
        return self._answer(shape, self.tables.attention if self.tables else None, self.roofline.attention)

    def moe_experts(self, shape: MoeExperts) -> KernelTime:
        return self._answer(shape, self.tables.moe_experts if self.tables else None, self.roofline.moe_experts)

    def collective(self, shape: Collective) -> KernelTime:
        return self._answer(shape, self.tables.collective if self.tables else None, self.roofline.collective)

    def elementwise(self, shape: Elementwise) -> KernelTime:
        return self._answer(shape, self.tables.elementwise if self.tables else None, self.roofline.elementwise)

    def forget_counts(self) -> None:
        """Start the account of `sources` afresh (the memo of times stays): one account per case simulated."""
        self._counts.clear()

    def source_counts(self) -> dict[str, dict[str, dict[Fit, int]]]:
        """Kernel kind -> source -> fit -> calls answered so far (for JSON output)."""
        out: dict[str, dict[str, dict[Fit, int]]] = {}
        for kind, counts in sorted(self._counts.items()):
            for (source, fit), n in counts.items():
                per_fit = out.setdefault(kind, {}).setdefault(source, {})
                per_fit[fit] = per_fit.get(fit, 0) + n
        return out

    def sources(self) -> dict[str, str]:
        """Kernel kind -> its sources, each with its calls by fit: ``"<table ...> (exact 3, interpolated 31);
        roofline (profile h200) (roofline 2)"``."""
        return {kind: "; ".join(f"{source} ({', '.join(f'{fit} {fits[fit]}' for fit in FITS if fit in fits)})"
                                for source, fits in per_source.items())
                for kind, per_source in self.source_counts().items()}


def kernel_costs_for(profile: HardwareProfile, database: KernelDbRef | None = None,
                     data_root: Path | None = None) -> LayeredKernels:
    """The kernel costs of ``profile``'s GPU: its tables (``database``, else the profile's ``kernel_db``)
    over its roofline; the roofline alone where neither names tables.

    Args:
        profile: the GPU's rates (the roofline) and the database it names.
        database: another database than the profile's (a ``--kernels`` option).
        data_root: another copy of the package's ``systems/data`` (tests).
    Returns:
        the layered costs; when the tables cannot be read (package missing, no tables for the GPU) the
        roofline alone, with the reason in ``notes`` and in a one-line warning.
    """
    roofline = RooflineKernels(profile)
    ref = database or profile.kernel_db
    if ref is None:
        return LayeredKernels(None, roofline, (f"profile {profile.name} names no kernel database: roofline for every kernel",))
    try:
        db = KernelDb.open(ref, data_root)
    except KernelDbUnavailable as exc:
        warnings.warn(str(exc), stacklevel=2)
        return LayeredKernels(None, roofline, (str(exc),))
    from disaggsdk.sim.table_kernels import TableKernels  # numpy, with the kernels extra

    return LayeredKernels(TableKernels(db, roofline), roofline, (f"kernel tables: {ref} ({db.package_version})",))
