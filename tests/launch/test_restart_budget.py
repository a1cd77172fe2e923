"""A unit's restarts are counted within a sliding window: a burst spends them, time gives them back."""

from __future__ import annotations

from disaggsdk.launch.launcher.restart_budget import RestartBudget


def test_restarts_within_the_window_are_bounded_and_older_ones_forgiven():
    budget = RestartBudget(max_restarts=2, window_s=60.0)
    assert budget.allows(0.0) and budget.spend(0.0) == 1
    assert budget.spend(10.0) == 2 and not budget.allows(20.0)  # a crash loop: no third restart in the window
    assert budget.used(59.0) == 2 and not budget.allows(59.0)
    assert budget.allows(60.5) and budget.used(60.5) == 1  # the first restart left the window
    assert budget.spend(61.0) == 2  # the back-off restarts from the attempt's place in the window
    assert budget.used(200.0) == 0


def test_no_restarts_allowed_means_none():
    assert not RestartBudget(max_restarts=0).allows(0.0)
