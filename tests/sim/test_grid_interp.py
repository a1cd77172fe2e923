"""grid_interp's promises: exact at measured points, monotone between them, the stated rules past them, cleaning counted."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsdk.sim.grid_interp import MonotoneGrid, SlicedTable, isotonic

# a 3 x 4 grid over (tokens, length), monotone already: cleaning moves nothing
TOKENS = (1, 4, 16)
LENGTHS = (128, 256, 512, 1024)
TIMES = np.array([[1.0, 1.5, 2.5, 4.5],
                  [2.0, 2.5, 3.5, 6.0],
                  [5.0, 6.0, 8.0, 12.0]])


def work(point: tuple[float, ...]) -> float:
    """A roofline proportional to tokens x length."""
    return point[0] * point[1] * 1e-3


GRID = MonotoneGrid([TOKENS, LENGTHS], TIMES)


def test_exact_at_every_measured_point():
    assert GRID.cleaned_points == 0
    for i, t in enumerate(TOKENS):
        for j, n in enumerate(LENGTHS):
            found = GRID.at((t, n), work)
            assert found is not None and found.value == TIMES[i, j] and found.fit == "exact"


def test_between_two_neighbours_is_linear_and_between_them():
    found = GRID.at((4, 384), work)
    assert found is not None and found.fit == "interpolated"
    assert found.value == pytest.approx((2.5 + 3.5) / 2)
    corner = GRID.at((10, 768), work)  # inside the cell (4..16) x (512..1024): bilinear
    assert corner is not None and corner.value == pytest.approx(0.5 * (0.5 * 3.5 + 0.5 * 6.0) + 0.5 * (0.5 * 8.0 + 0.5 * 12.0))
    assert 3.5 < corner.value < 12.0


def test_above_the_last_point_the_edge_keeps_its_efficiency_against_the_roofline():
    found = GRID.at((16, 4096), work)  # 4 x the last length
    assert found is not None and found.fit == "extrapolated"
    assert found.ratio == pytest.approx(4.0)
    assert found.value == pytest.approx(12.0 * 4.0)
    both = GRID.at((32, 2048), work)  # past the grid along both axes: clamp both, scale by the roofline's ratio
    assert both is not None and both.value == pytest.approx(12.0 * (32 * 2048) / (16 * 1024))
    between = GRID.at((8, 2048), work)  # inside along tokens, past along length: the clamped point is interpolated
    assert between is not None and between.value == pytest.approx((6.0 + (12.0 - 6.0) * 4 / 12) * 2.0)


def test_below_the_first_point_the_edge_time_is_held():
    found = GRID.at((1, 16), work)
    assert found is not None and found.fit == "extrapolated" and found.ratio == 1.0
    assert found.value == TIMES[0, 0]
    assert GRID.at((0.5, 384), work).value == pytest.approx((1.5 + 2.5) / 2)  # held along tokens, interpolated along length


def test_cleaning_pools_an_outlier_and_counts_the_points_it_moved():
    dipped = TIMES.copy()
    dipped[1, 2] = 2.0  # faster than its left neighbour (2.5) and than the point below it (2.5)
    grid = MonotoneGrid([TOKENS, LENGTHS], dipped)
    # along tokens the dip pools with the point below it (2.5, 2.0 -> 2.25, 2.25); then along lengths with
    # its left neighbour (2.5, 2.25 -> 2.375, 2.375): three points moved, the dip most (2.0 -> 2.375)
    assert grid.cleaned_points == 3
    assert grid.values[0, 2] == 2.25 and grid.values[1, 1] == grid.values[1, 2] == 2.375
    assert grid.largest_move == pytest.approx(0.1875)
    assert np.all(np.diff(grid.values, axis=0) >= 0) and np.all(np.diff(grid.values, axis=1) >= 0)
    untouched = grid.at((16, 1024), work)
    assert untouched is not None and untouched.value == 12.0 and untouched.fit == "exact"


def test_isotonic_is_the_pooled_least_squares_fit():
    assert isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([3.0, 2.0, 1.0]) == [2.0, 2.0, 2.0]
    assert isotonic([1.0, 2.0]) == [1.0, 2.0]


def test_a_ragged_grid_answers_outside_its_staircase_from_the_measured_point_below():
    ragged = TIMES.copy()
    ragged[2, 3] = np.nan  # 16 tokens x 1024 not measured (a token budget)
    grid = MonotoneGrid([TOKENS, LENGTHS], ragged)
    assert grid.measured_points == 11
    inside = grid.at((16, 512), work)
    assert inside is not None and inside.value == 8.0 and inside.fit == "exact"
    outside = grid.at((16, 768), work)  # its cell's lower corner (16, 512) is measured: efficiency held from there
    assert outside is not None and outside.fit == "extrapolated"
    assert outside.value == pytest.approx(8.0 * 768 / 512)
    empty = MonotoneGrid([TOKENS, LENGTHS], np.where(np.arange(12).reshape(3, 4) == 11, 1.0, np.nan))
    assert empty.at((1, 128), work) is None  # nothing measured at or below the query


def test_grids_from_scattered_points_average_repeated_measurements():
    grid = MonotoneGrid.from_points([[1, 2, 2, 4], [10, 10, 10, 10]], [1.0, 2.0, 4.0, 5.0])
    assert grid.axes == ((1.0, 2.0, 4.0), (10.0,))
    assert grid.at((2, 10), work).value == 3.0


def test_sliced_tables_match_categories_exactly_or_not_at_all():
    columns = {"dtype": ["bf16", "bf16", "fp8", "fp8"], "m": [1, 2, 1, 2]}
    table = SlicedTable(columns, ["dtype"], ["m"], [2.0, 4.0, 1.0, None])
    assert sorted(table.keys()) == [("bf16",), ("fp8",)]
    assert table.grid({"dtype": "bf16"}).at((1.5,), work).value == 3.0
    assert table.grid({"dtype": "fp8"}).measured_points == 1  # a row without a time is left out
    assert table.grid({"dtype": "int4"}) is None


def test_axes_must_increase():
    with pytest.raises(ValueError):
        MonotoneGrid([(1, 1, 2)], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        MonotoneGrid([(1, 2)], [1.0, 2.0, 3.0])


@st.composite
def noisy_grids(draw):
    """A 2-D grid of positive times with arbitrary dips, and two queries inside its box, one above the other."""
    def axis():
        return sorted(draw(st.sets(st.integers(1, 64), min_size=2, max_size=5)))
    xs, ys = axis(), axis()
    times = np.array(draw(st.lists(st.floats(0.1, 100.0), min_size=len(xs) * len(ys), max_size=len(xs) * len(ys))))
    low = (draw(st.floats(xs[0], xs[-1])), draw(st.floats(ys[0], ys[-1])))
    high = (draw(st.floats(low[0], xs[-1])), draw(st.floats(low[1], ys[-1])))
    return xs, ys, times.reshape(len(xs), len(ys)), low, high


@settings(max_examples=200, deadline=None)
@given(noisy_grids())
def test_any_grid_is_monotone_inside_and_between_the_neighbours_of_each_cell(case):
    xs, ys, times, low, high = case
    grid = MonotoneGrid([xs, ys], times)
    at_low, at_high = grid.at(low, work), grid.at(high, work)
    assert at_low.value <= at_high.value * (1 + 1e-12)  # more work never takes less time
    # between the cleaned values of the query's cell corners
    i, j = np.searchsorted(xs, low[0]), np.searchsorted(ys, low[1])
    cell = grid.values[max(i - 1, 0):i + 1, max(j - 1, 0):j + 1]
    assert cell.min() * (1 - 1e-12) <= at_low.value <= cell.max() * (1 + 1e-12)
    # exact at every grid point: the cleaned value
    for a, x in enumerate(xs):
        for b, y in enumerate(ys):
            assert grid.at((x, y), work).value == grid.values[a, b]


@settings(max_examples=100, deadline=None)
@given(noisy_grids(), st.floats(1.0, 50.0))
def test_extrapolation_is_monotone_along_the_extrapolated_axis(case, stretch):
    xs, ys, times, low, _ = case
    grid = MonotoneGrid([xs, ys], times)
    edge = grid.at((low[0], ys[-1]), work).value
    past = grid.at((low[0], ys[-1] * stretch), work)
    assert math.isclose(past.value, edge * stretch, rel_tol=1e-9)
    assert past.value >= edge * (1 - 1e-12)
