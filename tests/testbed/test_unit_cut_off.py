"""A decode unit cut off for longer than its request's deadline (issue 39 item 4): the request ends
with a clear error while the link is still cut, instead of being held until the heal; once the link
heals the unit is reachable again, reads the abort the router sent it, gives its pages back, and the
deployment serves the unfaulted tokens. The deployment and its helpers are test_link_faults'."""

from __future__ import annotations

import json
import time

import pytest

from disaggsdk.testbed import heal_link
from tests.testbed import test_link_faults as faults

UNREACHABLE_S = 4.0  # serve.unit_unreachable_s: under the transfer deadline (faults.DEADLINE_S, 5 s)
CUT_S = 12.0  # three times that; a cut of about a minute would outlast Ray's node health check
_FAULTS_SPEC_YAML = faults._spec_yaml


def _spec_yaml() -> str:
    import attrs

    from disaggsdk.spec import parse_spec_yaml, spec_to_yaml

    spec = parse_spec_yaml(_FAULTS_SPEC_YAML())
    return spec_to_yaml(attrs.evolve(spec, serve=attrs.evolve(spec.serve, unit_unreachable_s=UNREACHABLE_S)))


def _decode_state(deployment: faults._Deployment) -> str:
    return json.loads(deployment.front("GET", "/health"))["instances"]["decode-0"]


@pytest.mark.slow
def test_a_decode_unit_cut_off_past_its_deadline_fails_the_request_before_the_heal_then_serves_again(
        testbed, monkeypatch):
    monkeypatch.setattr(faults, "_spec_yaml", _spec_yaml)
    tb = faults._deployment_testbed(testbed)
    deployment = faults._Deployment(tb)
    try:
        baseline_pages = deployment.free_pages()
        want_long = deployment.ask(faults.LONG_PROMPT)["token_ids"]
        deployment.free_pages()
        tb, in_flight, cut_at = faults.cut_while_kv_crosses(deployment, tb)
        try:
            out, _ = in_flight.communicate(timeout=CUT_S)
            ended_after_cut_s = time.monotonic() - cut_at
            down_while_cut = _decode_state(deployment)
        finally:
            if in_flight.poll() is None:
                in_flight.kill()
                in_flight.wait(10)
            time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
            heal_link(tb, 1)
        outcome = json.loads(out)
        tb = tb.set_link(faults.FAST_LINK)
        healed_at = time.monotonic()
        while _decode_state(deployment) != "up":  # reachable again once TCP's retransmission gets through
            assert time.monotonic() - healed_at < 60, "decode-0 never came back after the heal"
            time.sleep(0.5)
        back_after_heal_s = time.monotonic() - healed_at
        after_heal = deployment.ask(faults.LONG_PROMPT)
        grants_open = faults.grant_keys_open_once_settled(deployment)
        metrics = deployment.front("GET", "/metrics")
        pages_after = deployment.free_pages()
    finally:
        deployment.stop()
    faults._report(case=f"cut {CUT_S:g} s mid-transfer, unit_unreachable_s {UNREACHABLE_S:g}", in_flight=outcome,
                   ended_after_cut_s=ended_after_cut_s, back_after_heal_s=back_after_heal_s,
                   launch_said=[line for line in deployment.lines if "unit " in line])
    # ended while the link was still cut, with a message that names the cause and says what to do
    assert ended_after_cut_s < CUT_S - 2, outcome
    assert "error" in outcome and "unreachable" in outcome["error"] and "retry" in outcome["error"], outcome
    assert "503" in outcome["error"], outcome  # no unit was left to serve it: a retryable status
    assert down_while_cut == "down"
    assert after_heal.get("token_ids") == want_long, after_heal
    for gauge in ("disaggsdk_num_requests_running", "disaggsdk_num_requests_waiting"):
        assert [faults._metric_value(metrics, gauge, e) for e in ("prefill-0", "decode-0")] == [0, 0], gauge
    assert pages_after == baseline_pages  # the abort it read after the heal freed the request's pages
    assert grants_open == 0  # every registration the cut transfer opened to remote writes is revoked
    assert faults._after_stop_no_shm_left(tb) == {node.name: [] for node in tb.nodes}
    assert faults._stopped_cleanly(deployment), "".join(deployment.lines)
