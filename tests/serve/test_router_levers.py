"""The operator's levers (rebalance, drain, move) against a fake runtime: none can leave a role without a
routable unit, a rebalance picks healthy units only and runs alone, a drain that fails undoes itself, a
request that finds no routable unit is a 503 with Retry-After, /health says why, and a move to a unit the
router judges unreachable ends at once (issue 55, findings 2, 3 and 8)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import UnitUnreachable
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.serve.http.http_server import HttpServer
from disaggsdk.serve.http.openai_app import build_app
from disaggsdk.serve.metrics import ServerMetrics
from disaggsdk.serve.moves.rebalance import rebalance
from disaggsdk.serve.moves.request_moves import LeverConflict, MoveError
from disaggsdk.serve.routing.router import Router
from tests.serve.test_router import FakeRuntime

PLAIN = SamplingParams()


class SwitchingRuntime(FakeRuntime):
    """A fake whose units change role when asked: at once, or once ``gate`` is set."""

    def __init__(self, roles: dict[str, str]):
        super().__init__(dict(roles))
        self.gate = threading.Event()
        self.gate.set()
        self.switches: list[tuple[str, str]] = []

    def send(self, unit, message):
        if not super().send(unit, message):
            return False
        if isinstance(message, ch.SwitchRole):
            self.switches.append((unit, message.role))
            if self.gate.is_set():
                self._switch(unit, message.role)
            else:
                threading.Thread(target=self._switch_after_gate, args=(unit, message.role), daemon=True).start()
        return True

    def placement(self):
        return {}

    def compile_stages(self):
        return dict.fromkeys(self.roles)

    def _switch_after_gate(self, unit: str, role: str) -> None:
        self.gate.wait(30)
        self._switch(unit, role)

    def _switch(self, unit: str, role: str) -> None:
        self.roles[unit] = role
        self.on_message(unit, ch.RoleChanged(UnitInfo(unit, unit, role, "inc", b"", [], b"", 0, 0)))


def deployment(roles: dict[str, str]) -> tuple[SwitchingRuntime, Router]:
    rt = SwitchingRuntime(roles)
    return rt, Router(rt)


P1_D2 = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}


# finding 2: rebalance


def test_with_one_decode_unit_dead_rebalance_refuses_to_switch_away_the_last_routable_one():
    rt, router = deployment(P1_D2)
    rt.die("decode-1")
    with pytest.raises(LeverConflict, match="decode-0") as refused:
        rebalance(router, prefill=2, decode=1)
    assert "down" in str(refused.value)
    assert rt.switches == [] and router.unit_roles()["decode-0"] == "decode"
    assert router.submit("r", [1, 2], PLAIN, lambda ev: None) == "decode-0"  # it serves on


def test_rebalance_picks_healthy_units_only_and_refuses_a_layout_only_down_units_could_reach():
    rt, router = deployment({"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode", "decode-2": "decode"})
    for i in range(3):
        unit = router.submit(f"r{i}", [1], PLAIN, lambda ev: None)
        rt.on_message(unit, ch.Tokens(f"r{i}", [7]))
    rt.on_message("decode-2", ch.Tokens("r2", [8], finished=True, finish_reason="length"))
    rt.die("decode-0")  # holds nothing now (its request ended): (load, name) picked it first
    report = rebalance(router, prefill=2, decode=2)
    assert report.done and rt.switches == [("decode-2", "prefill")], report
    # a prefill unit that is down cannot turn decode; the healthy one is the last prefill unit left
    rt, router = deployment({"prefill-0": "prefill", "prefill-1": "prefill", "decode-0": "decode"})
    rt.die("prefill-1")
    with pytest.raises(LeverConflict, match="prefill-0"):
        rebalance(router, prefill=1, decode=2)  # prefill-1 (down) would be all that prefills
    with pytest.raises(LeverConflict, match="prefill-1"):
        rebalance(router, prefill=0, decode=3)  # prefill-1 would have to turn, and it is down
    assert rt.switches == []


def test_a_second_rebalance_while_one_runs_is_refused_and_the_first_one_ends_as_asked():
    rt, router = deployment(P1_D2)
    rt.gate.clear()  # the unit answers its switch only once the second call was refused
    first: list = []
    runner = threading.Thread(target=lambda: first.append(rebalance(router, prefill=2, decode=1)))
    runner.start()
    deadline = time.monotonic() + 10
    while not rt.switches:
        assert time.monotonic() < deadline, "the first rebalance never asked a unit to switch"
        time.sleep(0.01)
    with pytest.raises(LeverConflict, match="rebalance is running"):
        rebalance(router, prefill=1, decode=2)
    rt.gate.set()
    runner.join(30)
    assert first[0].done and sorted(router.unit_roles().values()) == ["decode", "prefill", "prefill"]
    assert rebalance(router, prefill=1, decode=2).done  # and once it answered, the next one runs


# finding 3: drains


def test_a_drain_that_would_leave_no_routable_decode_unit_is_refused():
    rt, router = deployment(P1_D2)
    assert router.drain("decode-0", timeout_s=1).drained
    with pytest.raises(LeverConflict, match="decode-0 is drained"):
        router.drain("decode-1", timeout_s=1)
    assert router.submit("r", [1], PLAIN, lambda ev: None) == "decode-1"
    router.undrain("decode-0")
    rt.die("decode-1")
    with pytest.raises(LeverConflict, match="decode-1 is down"):
        router.drain("decode-0", timeout_s=1)
    assert router.submit("s", [1], PLAIN, lambda ev: None) == "decode-0"


def test_a_drain_that_fails_routes_to_its_unit_again():
    rt, router = deployment(P1_D2)
    assert router.submit("r", [1, 2], PLAIN, lambda ev: None) == "decode-0"
    rt.on_message("decode-0", ch.Tokens("r", [7]))  # decoding: a drain moves it, and nobody answers the move
    report = router.drain("decode-0", timeout_s=0.3)
    assert not report.drained and report.remaining == ["r"] and report.routed
    assert router.submit("s", [1], PLAIN, lambda ev: None) == "decode-1"
    assert router.submit("t", [1], PLAIN, lambda ev: None) == "decode-0"  # routed again


def test_no_routable_decode_unit_is_a_503_with_retry_after_and_health_says_why():
    rt, router = deployment(P1_D2)
    http = HttpServer(build_app(router, ServerMetrics(router.stats, router.model_name))).start()
    try:
        assert router.drain("decode-0", timeout_s=1).drained
        rt.die("decode-1")  # after the drain: no lever refused this, a unit died
        r = httpx.post(f"{http.url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=10)
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0, r.text
        error = r.json()["error"]
        assert error["code"] == 503 and error["type"] == "server_error"
        assert "decode-0 is drained" in error["message"] and "decode-1 is down" in error["message"]
        health = httpx.get(f"{http.url}/health", timeout=10)
        assert health.status_code == 503 and int(health.headers["retry-after"]) > 0
        body = health.json()
        assert body["status"] == "degraded" and body["instances"]["decode-0"] == "up"
        assert any("no decode unit is routable" in line and "decode-0 is drained" in line for line in body["reasons"])
        router.undrain("decode-0")
        health = httpx.get(f"{http.url}/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "degraded"  # decode-1 is still down
        assert health.json()["reasons"] == ["decode-1 is down"]
    finally:
        http.stop()
        router.close()


def test_health_says_degraded_while_a_role_has_no_routable_unit():
    rt, router = deployment(P1_D2)
    http = HttpServer(build_app(router, ServerMetrics(router.stats, router.model_name))).start()
    try:
        assert httpx.get(f"{http.url}/health", timeout=10).json()["status"] == "ok"
        rt.stalled.add("prefill-0")  # alive, unheard: decode units prefill locally meanwhile
        health = httpx.get(f"{http.url}/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["reasons"][0].startswith("no prefill unit is healthy: prefill-0 is down")
    finally:
        http.stop()
        router.close()


# finding 8 (third item): moves


def test_a_move_to_a_unit_judged_unreachable_ends_at_once_and_the_request_goes_on():
    rt, router = deployment(P1_D2)
    events = []
    assert router.submit("r", [5, 6], PLAIN, events.append) == "decode-0"
    rt.on_message("decode-0", ch.Tokens("r", [1]))
    outcome = router.move("r", "decode-1")
    rt.stalled.add("decode-1")
    rt.on_message("decode-1", UnitUnreachable(10.0))
    cancels = [m for u, m in rt.sent if u == "decode-0" and isinstance(m, ch.CancelMove)]
    assert [c.request_id for c in cancels] == ["r"] and "unreachable" in cancels[0].reason
    # the source resumes it and says so: the move ends, the request streams on where it was
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=False, reason=cancels[0].reason))
    assert not outcome.result(0).moved and "unreachable" in outcome.result(0).reason
    rt.on_message("decode-0", ch.Tokens("r", [2], finished=True, finish_reason="length"))
    assert [t for ev in events for t in ev.new_token_ids] == [1, 2] and events[-1].finish_reason == "length"


def test_a_move_to_a_drained_or_down_unit_is_refused():
    rt, router = deployment({"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode", "decode-2": "decode"})
    assert router.submit("r", [5, 6], PLAIN, lambda ev: None) == "decode-0"
    rt.on_message("decode-0", ch.Tokens("r", [1]))
    assert router.drain("decode-1", timeout_s=1).drained
    with pytest.raises(LeverConflict, match="decode-1 is drained"):
        router.move("r", "decode-1")
    rt.die("decode-2")
    with pytest.raises(LeverConflict, match="decode-2 is down"):
        router.move("r", "decode-2")
    with pytest.raises(MoveError, match="not another healthy decode unit") as refused:
        router.move("r", "prefill-0")
    assert not isinstance(refused.value, LeverConflict)  # a 400: no unit state makes a prefill unit a target
