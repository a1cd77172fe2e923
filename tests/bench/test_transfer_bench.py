"""`disaggsdk transfer-bench` runs end to end (small sizes; timings are not asserted)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("provider,flags,path", [("shm", [], "direct"), ("shm", ["--no-direct"], "fabric"),
                                                 ("tcp", [], "fabric")])
def test_bench_json(run_cli, provider, flags, path):
    out = run_cli("transfer-bench", "--provider", provider, "--sizes", "8K,1M", "--region-mib", "2",
                  "--total-mib", "4", "--json", *flags, timeout_s=120)
    assert out.returncode == 0, out.stderr
    cells = json.loads(out.stdout)
    assert [(c["write_bytes"], c["page_map"]) for c in cells] == [
        (8192, "contiguous"), (8192, "random"), (1 << 20, "contiguous"), (1 << 20, "random")]
    assert {c["path"] for c in cells} == {path}
    first = cells[0]
    assert first["num_writes"] == 512 and first["num_posted"] == 2  # 2 batches, one write each
    # scattered pages: one write each through libfabric; copied directly, one signal per batch
    assert cells[1]["num_posted"] == (2 if path == "direct" else cells[1]["num_writes"])
    for c in cells:
        assert c["gb_per_s"] > 0 and c["memcpy_gb_per_s"] > 0 and c["latency_p50_ms"] > 0


def test_bad_provider_is_a_user_error(run_cli):
    out = run_cli("transfer-bench", "--provider", "nosuchprovider", "--sizes", "4K",
                  "--region-mib", "1", "--total-mib", "1", timeout_s=120)
    assert out.returncode == 2 and "nosuchprovider" in out.stderr
