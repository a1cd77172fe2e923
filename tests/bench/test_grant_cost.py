"""The grant-cost benchmark opens and revokes real registrations and digests the pages it granted."""

from __future__ import annotations

import json

import pytest

from disaggsdk.bench.grant_cost import main, measure


@pytest.mark.parametrize("provider", ["tcp", "shm"])
def test_one_registration_per_run_of_pages_per_layer_and_one_for_the_context(provider):
    out = measure(provider, num_layers=3, page_bytes=512, num_pages=10, num_runs=2, repeat=2)
    assert out["num_pages"] == 10 and out["registrations_per_grant"] == 3 * 2 + 1
    assert out["kv_bytes_per_grant"] == 3 * 10 * 512
    assert out["grant_open_revoke_us"] > 0 and out["digest_gb_per_s"] > 0


def test_the_command_prints_json(capsys):
    assert main(["--layers", "2", "--pages", "4", "--runs", "1", "--repeat", "1", "--page-kib", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["registrations_per_grant"] == 2 + 1
