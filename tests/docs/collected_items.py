"""A pytest plugin that writes what a collection found, for the docs checks that cite tests.

``pytest --collect-only -p tests.docs.collected_items FILES`` with ``DISAGGSDK_COLLECTED_ITEMS=PATH``
writes to PATH one JSON object per collected test: its node id, whether it carries the ``gpu`` and
``slow`` markers, and whether its skip markers (``skip``, ``skipif``) would skip it on this machine,
as pytest itself evaluates them. Files that skip as a whole at import (``pytest.importorskip``) give
no items, and are listed under ``"skipped_files"``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _pytest.skipping import evaluate_skip_marks

OUTPUT_ENV = "DISAGGSDK_COLLECTED_ITEMS"


class CollectedItems:
    """Collects the items and the files skipped at import, and writes them when collection ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped_files: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.skipped_files.append(report.nodeid)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        items = [{"nodeid": item.nodeid,
                  "gpu": item.get_closest_marker("gpu") is not None,
                  "slow": item.get_closest_marker("slow") is not None,
                  "skips_here": evaluate_skip_marks(item) is not None}
                 for item in session.items]
        self.path.write_text(json.dumps({"items": items, "skipped_files": self.skipped_files}), encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    output = os.environ.get(OUTPUT_ENV)
    if output:
        config.pluginmanager.register(CollectedItems(Path(output)), "disaggsdk-collected-items")
