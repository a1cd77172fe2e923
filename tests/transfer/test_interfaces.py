"""Which interface a tcp endpoint listens on: FI_TCP_IFACE, else the one holding the node's address,
else loopback; an address no interface holds is one clear error."""

from __future__ import annotations

import pytest

from disaggsdk.transfer.errors import TransferError
from disaggsdk.transfer.interfaces import TCP_IFACE_ENV, interface_address, interface_holding, tcp_domain


def test_loopback_holds_127_0_0_1():
    assert interface_address("lo") == "127.0.0.1"
    assert interface_holding("127.0.0.1") == "lo"
    assert interface_address("no-such-if0") is None


def test_an_address_no_interface_holds_names_the_fix():
    with pytest.raises(TransferError, match=rf"no network interface here holds 192\.0\.2\.7.*{TCP_IFACE_ENV}"):
        interface_holding("192.0.2.7")  # TEST-NET-1: never configured here
    with pytest.raises(TransferError, match="not an IPv4 address"):
        interface_holding("fe80::1")


def test_tcp_domain_prefers_fi_tcp_iface_then_the_node_address_then_loopback(monkeypatch):
    monkeypatch.delenv(TCP_IFACE_ENV, raising=False)
    assert tcp_domain(None) == "lo"
    assert tcp_domain("127.0.0.1") == "lo"
    monkeypatch.setenv(TCP_IFACE_ENV, "eth7")
    assert tcp_domain(None) == "eth7" and tcp_domain("192.0.2.7") == "eth7"  # named: no lookup
