"""Every test here runs in `make test-latest` and `make test-oldest` too: the GPU libraries' newest and
oldest allowed versions must take the project's calls (tools/deps_check.py)."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/gpu_api/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.deps_smoke)
