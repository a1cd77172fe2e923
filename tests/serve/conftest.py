"""A served tiny model shared by the server tests (one engine, started once per module)."""

from __future__ import annotations

import pytest

SERVED_MODEL = "qwen3-coder-tiny"


@pytest.fixture(scope="module")
def deployment():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    d = serve_model(SERVED_MODEL, EngineConfig(num_pages=256, max_num_seqs=16), port=0)
    try:
        yield d
    finally:
        d.shutdown()
