"""Which network interface a tcp endpoint listens on (its libfabric domain).

libfabric's tcp provider names its domains after network interfaces ("eth0", "lo") and an endpoint
is reachable at its interface's address only. A unit whose peers all run on this machine listens
on "lo" (nothing outside the machine can reach its KV pools); a unit whose peers are on other
hosts listens on the interface that holds its node's address (the Ray node IP the launcher gives
it). ``FI_TCP_IFACE``, libfabric's own setting, names the interface explicitly and wins over both.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

from disaggsdk.transfer.errors import TransferError

TCP_IFACE_ENV = "FI_TCP_IFACE"  # libfabric's tcp provider reads the same variable
_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (primary) IPv4 address
_IFREQ_BYTES = 40


def interface_address(name: str) -> str | None:
    """The primary IPv4 address of interface ``name``, or None where it has none (or no such interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(f"{_IFREQ_BYTES}s", name.encode()[:15])
        try:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])  # struct ifreq: 16-byte name, then a sockaddr_in


def interface_holding(address: str) -> str:
    """The name of this machine's network interface whose address is ``address`` (IPv4).

    Raises:
        TransferError: ``address`` is not IPv4, or no interface here holds it (as primary address).
    """
    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        raise TransferError(f"the KV endpoint's address {address!r} is not an IPv4 address; name the interface "
                            f"with {TCP_IFACE_ENV}=IFACE in the units' environment") from None
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        if interface_address(name) == str(wanted):
            return name
    raise TransferError(f"no network interface here holds {address} (interfaces: {', '.join(names) or 'none'}); "
                        f"name the one that reaches the other nodes with {TCP_IFACE_ENV}=IFACE")


def tcp_domain(node_address: str | None) -> str:
    """The interface a tcp endpoint listens on: ``FI_TCP_IFACE`` when set, else the interface holding
    ``node_address`` (a unit whose peers are on other hosts), else "lo" (every peer on this machine).

    Raises:
        TransferError: ``node_address`` is held by no interface here (`interface_holding`).
    """
    named = os.environ.get(TCP_IFACE_ENV, "").strip()
    if named:
        return named
    if node_address is None:
        return "lo"
    return interface_holding(node_address)
