"""Interpolation over a table of measured times: exact at its points, monotone between them, stated past them.

A table's columns are categorical (a dtype, a head count, a kernel: a query matches one value exactly,
or the table does not answer) or work axes (tokens, sizes, lengths: more work never takes less time).
`SlicedTable` groups a table's rows by their categorical values; each group is a `MonotoneGrid` over
its work axes, built (and cleaned) the first time a query needs it. Nothing here knows what is being
timed: the caller passes the coordinates and, for extrapolation, the roofline time of any point.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import attrs
import numpy as np
import numpy.typing as npt

GridFit = Literal["exact", "interpolated", "extrapolated"]
Point = tuple[float, ...]
Roofline = Callable[[Point], float]  # seconds the roofline gives a point of the work axes (> 0)
Cell = str | int | float  # one value of a table's column

MOVED = 0.01  # relative change above which cleaning counts a point as moved


@attrs.frozen
class Lookup:
    """A time read from a grid, how it was read, and the roofline ratio applied past the grid (1.0 inside)."""

    value: float
    fit: GridFit
    ratio: float = 1.0


def isotonic(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing fit of ``values`` (pool adjacent violators, equal weights)."""
    means: list[float] = []
    counts: list[int] = []
    for v in values:
        means.append(float(v))
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            count = counts[-2] + counts[-1]
            mean = (means[-2] * counts[-2] + means[-1] * counts[-1]) / count
            means[-2:] = [mean]
            counts[-2:] = [count]
    return [m for m, c in zip(means, counts) for _ in range(c)]


def _clean(measured: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``measured`` (NaN: not measured) made non-decreasing along every axis (module doc, rule 1)."""
    out = measured.copy()
    for axis in range(out.ndim):
        lines = np.moveaxis(out, axis, -1)  # a view: writing a line writes ``out``
        for index in np.ndindex(lines.shape[:-1]):
            line = lines[index]
            mask = ~np.isnan(line)
            kept = line[mask]
            if kept.size > 1 and np.any(np.diff(kept) < 0):
                line[mask] = isotonic(kept.tolist())
    for axis in range(out.ndim):
        lines = np.moveaxis(out, axis, -1)
        missing = np.isnan(lines)
        lines[...] = np.where(missing, np.nan, np.fmax.accumulate(lines, axis=-1))
    return out


class MonotoneGrid:
    """Times on a (possibly ragged) grid over work axes, cleaned to be monotone, read by the module doc's rules."""

    def __init__(self, axes: Sequence[Sequence[float]], measured: npt.ArrayLike) -> None:
        """
        Args:
            axes: the grid's points along each work axis, strictly increasing.
            measured: times of shape ``[len(a) for a in axes]``; NaN where nothing was measured.
        Raises:
            ValueError: axes not strictly increasing, or a shape that does not match them.
        """
        self.axes: tuple[tuple[float, ...], ...] = tuple(tuple(float(x) for x in a) for a in axes)
        raw = np.asarray(measured, dtype=np.float64)
        if raw.shape != tuple(len(a) for a in self.axes):
            raise ValueError(f"values of shape {raw.shape} do not fit axes of lengths {[len(a) for a in self.axes]}")
        if any(len(a) == 0 or any(x >= y for x, y in itertools.pairwise(a)) for a in self.axes):
            raise ValueError("every axis needs at least one point, in strictly increasing order")
        self.values = _clean(raw)
        known = ~np.isnan(raw)
        self.measured_points = int(known.sum())
        change = np.where(known, np.abs(self.values - raw) / np.where(known, np.abs(raw), 1.0), 0.0)
        self.cleaned_points = int((change > MOVED).sum())
        self.largest_move = float(change.max()) if change.size else 0.0  # relative, of any measured point

    @classmethod
    def from_points(cls, coordinates: Sequence[Sequence[float]], times: Sequence[float]) -> MonotoneGrid:
        """The grid spanned by scattered measurements: ``coordinates[i][j]`` is point j's value on axis i.
        Points measured twice keep the mean of their times."""
        axes, indices = [], []
        for column in coordinates:
            points, inverse = np.unique(np.asarray(column, dtype=np.float64), return_inverse=True)
            axes.append(points.tolist())
            indices.append(inverse)
        shape = tuple(len(a) for a in axes)
        sums = np.zeros(shape)
        counts = np.zeros(shape)
        where = tuple(indices)
        np.add.at(sums, where, np.asarray(times, dtype=np.float64))
        np.add.at(counts, where, 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return cls(axes, np.where(counts > 0, sums / counts, np.nan))

    @property
    def ndim(self) -> int:
        return len(self.axes)

    def _corners(self, point: Point) -> list[tuple[tuple[int, ...], float]]:
        # the bracketing cell of a point inside the grid's box: (index, multilinear weight) per corner
        per_axis: list[tuple[tuple[int, float], ...]] = []
        for x, points in zip(point, self.axes):
            j = bisect.bisect_left(points, x)
            if points[j] == x:
                per_axis.append(((j, 1.0),))
            else:
                w = (x - points[j - 1]) / (points[j] - points[j - 1])
                per_axis.append(((j - 1, 1.0 - w), (j, w)))
        return [(tuple(i for i, _ in combo), math.prod(w for _, w in combo)) for combo in itertools.product(*per_axis)]

    def _measured_at_or_below(self, start: tuple[int, ...]) -> tuple[int, ...] | None:
        # breadth first from ``start``, one index step down at a time: the nearest measured grid point
        frontier, seen = [start], {start}
        while frontier:
            measured = [i for i in frontier if not math.isnan(self.values[i])]
            if measured:
                return max(measured)  # ties: the one furthest along the first axis, then the next
            below = []
            for index in frontier:
                for axis in range(self.ndim):
                    if index[axis] > 0:
                        lower = index[:axis] + (index[axis] - 1,) + index[axis + 1:]
                        if lower not in seen:
                            seen.add(lower)
                            below.append(lower)
            frontier = below
        return None

    def at(self, query: Sequence[float], roofline: Roofline) -> Lookup | None:
        """The time at ``query`` (one coordinate per work axis), by the module doc's rules.

        Args:
            query: a point of the work axes.
            roofline: the roofline time of a point (used only past the grid's last points or outside a ragged edge).
        Returns:
            the time and its fit; None when no measured point lies at or below the query's cell (rule 5).
        """
        if len(query) != self.ndim:
            raise ValueError(f"a query of {len(query)} coordinates on a grid of {self.ndim} axes")
        target: list[float] = []  # the query, held at the first point below the grid (rule 4)
        inside: list[float] = []  # and clamped to the last point above it (rule 3)
        held = above = False
        for x, points in zip(query, self.axes):
            x = float(x)
            if x < points[0]:
                x, held = points[0], True
            target.append(x)
            if x > points[-1]:
                inside.append(points[-1])
                above = True
            else:
                inside.append(x)
        corners = self._corners(tuple(inside))
        corner_values = [float(self.values[index]) for index, _ in corners]
        if not any(math.isnan(v) for v in corner_values):
            value = math.fsum(w * v for (_, w), v in zip(corners, corner_values))
            if not above:
                fit: GridFit = "extrapolated" if held else "exact" if len(corners) == 1 else "interpolated"
                return Lookup(value, fit)
            anchor_point, anchor_value = tuple(inside), value
        else:
            anchor = self._measured_at_or_below(corners[0][0])
            if anchor is None:
                return None
            anchor_point = tuple(self.axes[axis][i] for axis, i in enumerate(anchor))
            anchor_value = float(self.values[anchor])
        base = roofline(anchor_point)
        ratio = roofline(tuple(target)) / base if base > 0 else 1.0
        return Lookup(anchor_value * ratio, "extrapolated", ratio)


class SlicedTable:
    """A table's rows grouped by their categorical columns, each group a `MonotoneGrid` over the work columns."""

    def __init__(self, columns: Mapping[str, Sequence[Cell]], categorical: Sequence[str], work: Sequence[str],
                 times: Sequence[float | None]) -> None:
        """
        Args:
            columns: the table's columns by name (every one named in ``categorical`` and ``work``).
            categorical: columns a query must match exactly.
            work: columns of the grid's axes, in the order queries give them.
            times: one time per row; rows whose time is not a positive number are left out.
        """
        self.categorical = tuple(categorical)
        self.work = tuple(work)
        self._columns = columns
        self._rows: dict[tuple[Cell, ...], list[int]] = {}
        keys = zip(*(columns[c] for c in self.categorical)) if self.categorical else itertools.repeat(())
        self._times: list[float] = []
        for row, (key, t) in enumerate(zip(keys, times)):
            self._times.append(float("nan") if t is None else float(t))
            if t is not None and math.isfinite(t) and t > 0:
                self._rows.setdefault(tuple(key), []).append(row)
        self._grids: dict[tuple[Cell, ...], MonotoneGrid] = {}

    def keys(self) -> list[tuple[Cell, ...]]:
        """The categorical values the table measured, one tuple per group."""
        return list(self._rows)

    def grid(self, key: Mapping[str, Cell]) -> MonotoneGrid | None:
        """The grid of the rows whose categorical columns equal ``key``'s values; None if there are none.

        Raises:
            KeyError: ``key`` lacks one of the categorical columns.
        """
        wanted = tuple(key[c] for c in self.categorical)
        grid = self._grids.get(wanted)
        if grid is None:
            rows = self._rows.get(wanted)
            if rows is None:
                return None
            coordinates = [[float(self._columns[w][r]) for r in rows] for w in self.work]
            grid = MonotoneGrid.from_points(coordinates, [self._times[r] for r in rows])
            self._grids[wanted] = grid
        return grid
