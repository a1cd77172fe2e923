"""Host and Origin checks: loopback by default, so web pages cannot reach a local server."""

from __future__ import annotations

from disaggsdk.serve.http.http_guard import HostGuard


def test_loopback_names_with_any_port_pass_and_others_are_refused():
    guard = HostGuard()
    for host in ("127.0.0.1:8000", "localhost", "[::1]:9", "LOCALHOST:1"):
        assert guard.refusal(host, None) is None, host
    assert "serve.allowed_hosts" in guard.refusal("evil.example:8000", None)  # DNS rebinding
    assert "serve.allowed_hosts" in guard.refusal(None, None)


def test_a_foreign_or_null_origin_is_refused_and_star_allows_all():
    guard = HostGuard()
    assert guard.refusal("127.0.0.1:8000", "http://localhost:3000") is None
    assert "web pages" in guard.refusal("127.0.0.1:8000", "https://evil.example")
    assert "web pages" in guard.refusal("127.0.0.1:8000", "null")
    assert HostGuard(["*"]).refusal("anything", "https://evil.example") is None
    assert HostGuard(["gpu-01.lan"]).refusal("gpu-01.lan:8000", None) is None
