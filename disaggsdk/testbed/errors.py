"""The testbed's typed errors: each message says what is wrong and what to do about it."""

from __future__ import annotations

from disaggsdk.errors import DisaggError


class TestbedError(DisaggError):
    """A testbed cannot be built, read or torn down (bad input, a failed `ip`/`tc` command, no such testbed)."""

    __test__ = False  # a class named Test* is not a pytest test class


class TestbedUnavailable(TestbedError):
    """This machine or user cannot build a testbed: not root, or iproute2/util-linux commands missing."""


class NetemUnavailable(TestbedError):
    """A link asks for delay or loss and the kernel has no ``sch_netem`` qdisc (rate shaping still works)."""


class PacketDropUnavailable(TestbedError):
    """A link asks for loss and this machine can drop packets neither with ``sch_netem`` nor with
    nftables (the ``nft`` command is missing)."""
