"""A node's link to the switch: its rate, delay and loss (`LinkSpec`), and the ``tc`` qdiscs that
shape it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from disaggsdk.testbed.errors import NetemUnavailable
from disaggsdk.testbed.packet_delay import iptables_available
from disaggsdk.testbed.state import LinkState
from disaggsdk.testbed.tools import run_tool, try_tool

MTU_BYTES = 1500
# tbf's bucket: large enough for the kernel's timer granularity at high rates (2 ms of line rate)
# and for ten full frames at low ones, small enough that a transfer's first bytes are not sent
# faster than the rate for long
TBF_BURST_S = 0.002
TBF_MIN_BURST_BYTES = 10 * MTU_BYTES
# how long a packet may wait in tbf's queue before it is dropped: deep enough that a TCP sender
# at line rate is paced by its acks, not by drops
TBF_LATENCY_MS = 100
NETEM_MIN_LIMIT_PACKETS = 1000  # netem's own default

_RATE = re.compile(r"^(\d+(?:\.\d*)?)(bit|kbit|mbit|gbit|tbit)$")
_RATE_MBIT_PER_UNIT = {"bit": 1e-6, "kbit": 1e-3, "mbit": 1.0, "gbit": 1e3, "tbit": 1e6}
_DELAY = re.compile(r"^(\d+(?:\.\d*)?)(us|ms|s)$")
_DELAY_MS_PER_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}
_LOSS = re.compile(r"^(\d+(?:\.\d*)?)%$")


@dataclass(frozen=True)
class LinkSpec:
    """What every node's link offers.

    Attributes:
        rate_mbit: line rate in megabits (10^6 bits) per second, each direction.
        delay_ms: one-way delay a packet between two nodes meets, milliseconds (netem; the
            user-space delayer without it).
        loss_pct: share of packets between two nodes that are dropped, percent (netem; nftables without it).
    """

    rate_mbit: float
    delay_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_mbit) and self.rate_mbit >= 0.001):
            raise ValueError(f"link rate {self.rate_mbit} Mbit/s: give at least 1kbit")
        if not (math.isfinite(self.delay_ms) and self.delay_ms >= 0):
            raise ValueError(f"link delay {self.delay_ms} ms: give zero or more")
        if not (math.isfinite(self.loss_pct) and 0 <= self.loss_pct < 100):
            raise ValueError(f"link loss {self.loss_pct}%: give at least 0% and less than 100%")

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        """Read ``RATE[,DELAY[,LOSS]]``, e.g. ``1gbit``, ``100mbit,5ms``, ``10mbit,20ms,1%``.

        RATE is bits per second with a tc unit (bit, kbit, mbit, gbit, tbit; k = 1000); DELAY has
        us, ms or s; LOSS ends in %.

        Raises:
            ValueError: the text does not read so; the message names the part and the form.
        """
        parts = [part.strip().lower() for part in text.split(",")]
        if not 1 <= len(parts) <= 3 or not parts[0]:
            raise ValueError(f"--link {text!r}: write RATE[,DELAY[,LOSS]], e.g. 100mbit,5ms,1%")
        return cls(rate_mbit=parse_rate_mbit(parts[0]),
                   delay_ms=parse_delay_ms(parts[1]) if len(parts) > 1 else 0.0,
                   loss_pct=parse_loss_pct(parts[2]) if len(parts) > 2 else 0.0)

    @property
    def needs_netem(self) -> bool:
        """Whether the link asks for delay or loss, which netem gives (the loss also nftables)."""
        return self.delay_ms > 0 or self.loss_pct > 0

    @property
    def rate_bytes_per_s(self) -> float:
        """The line rate in bytes per second."""
        return self.rate_mbit * 1e6 / 8

    def describe(self) -> str:
        """The link as ``--link`` writes it: ``100mbit``, ``100mbit,5ms,1%``."""
        text = f"{self.rate_mbit:g}mbit"
        if self.needs_netem:
            text += f",{self.delay_ms:g}ms"
        if self.loss_pct:
            text += f",{self.loss_pct:g}%"
        return text

    def to_dict(self) -> LinkState:
        """The fields as JSON numbers (the state file, ``--json``)."""
        return {"rate_mbit": self.rate_mbit, "delay_ms": self.delay_ms, "loss_pct": self.loss_pct}

    @classmethod
    def from_dict(cls, data: LinkState) -> LinkSpec:
        """The inverse of `to_dict`."""
        return cls(rate_mbit=float(data["rate_mbit"]), delay_ms=float(data.get("delay_ms", 0.0)),
                   loss_pct=float(data.get("loss_pct", 0.0)))


def parse_rate_mbit(text: str) -> float:
    """A rate with a tc bit unit (``100mbit``, ``1gbit``, ``2.5gbit``) in Mbit/s.

    Raises:
        ValueError: no number or no bit unit; bytes units (``mbps``) are refused, tc reads them as bytes.
    """
    found = _RATE.match(text.strip().lower())
    if not found:
        raise ValueError(f"link rate {text!r}: write a number and a bit unit (bit, kbit, mbit, gbit, tbit), "
                         "e.g. 100mbit")
    return float(found.group(1)) * _RATE_MBIT_PER_UNIT[found.group(2)]


def parse_delay_ms(text: str) -> float:
    """A delay (``5ms``, ``250us``, ``0.1s``) in milliseconds.

    Raises:
        ValueError: no number or no unit among us, ms, s.
    """
    found = _DELAY.match(text.strip().lower())
    if not found:
        raise ValueError(f"link delay {text!r}: write a number and us, ms or s, e.g. 5ms")
    return float(found.group(1)) * _DELAY_MS_PER_UNIT[found.group(2)]


def parse_loss_pct(text: str) -> float:
    """A loss share (``1%``, ``0.5%``) in percent.

    Raises:
        ValueError: not a number followed by %.
    """
    found = _LOSS.match(text.strip())
    if not found:
        raise ValueError(f"link loss {text!r}: write a percentage, e.g. 1%")
    return float(found.group(1))


def netem_available(namespace: str) -> bool:
    """Whether the kernel has ``sch_netem``: a netem qdisc is added to (and removed from) the
    loopback of ``namespace``, a namespace of the testbed, never the host's."""
    added = try_tool(["tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"])
    if added:
        try_tool(["tc", "-n", namespace, "qdisc", "del", "dev", "lo", "root"])
    return added


def netem_shapes(link: LinkSpec, namespace: str) -> bool:
    """Check that ``link`` can be shaped here and say whether netem shapes its delay and loss.

    Args:
        link: the link wanted.
        namespace: a namespace of the testbed to probe the kernel in (`netem_available`).

    Returns:
        True where netem adds the delay and the loss; False where the link asks for neither, or
        the kernel has no sch_netem: the caller then drops the loss with nftables
        (`link_faults.set_link_loss`) and holds the delay in the user-space delayer
        (`link_faults.set_link_delay`).

    Raises:
        NetemUnavailable: it asks for delay, the kernel has no sch_netem and ``iptables``, which
            feeds the delayer, is missing.
    """
    if not link.needs_netem:
        return False
    if netem_available(namespace):
        return True
    if link.delay_ms > 0 and not iptables_available():
        keep = f"{link.rate_mbit:g}mbit" + (f",0ms,{link.loss_pct:g}%" if link.loss_pct else "")
        raise NetemUnavailable(
            f"--link {link.describe()}: this kernel has no sch_netem qdisc, and the user-space delayer that "
            "holds the delay without it queues packets with iptables' NFQUEUE, but the `iptables` command is "
            f"missing: install iptables (apt-get install iptables), use --link {keep}, or a kernel with "
            "sch_netem (CONFIG_NET_SCH_NETEM, modprobe sch_netem)")
    return False


def tbf_args(link: LinkSpec) -> list[str]:
    """The ``tbf`` qdisc's arguments for ``link``'s rate."""
    burst_bytes = max(TBF_MIN_BURST_BYTES, math.ceil(link.rate_bytes_per_s * TBF_BURST_S))
    return ["tbf", "rate", f"{round(link.rate_mbit * 1e6)}bit", "burst", str(burst_bytes),
            "latency", f"{TBF_LATENCY_MS}ms"]


def delay_queue_packets(link: LinkSpec, delay_ms: float) -> int:
    """How many packets a queue that delays ``link``'s packets by up to ``delay_ms`` holds (netem's
    ``limit``, the user-space delayer's queue): twice a full delay's worth at line rate, so the
    delay alone drops nothing."""
    in_flight_packets = math.ceil(link.rate_bytes_per_s * delay_ms / 1e3 / MTU_BYTES)
    return max(NETEM_MIN_LIMIT_PACKETS, 2 * in_flight_packets)


def netem_args(link: LinkSpec) -> list[str]:
    """The ``netem`` qdisc's arguments for ``link``'s delay and loss (its queue: `delay_queue_packets`)."""
    args = ["netem", "limit", str(delay_queue_packets(link, link.delay_ms))]
    if link.delay_ms:
        args += ["delay", f"{link.delay_ms:g}ms"]
    if link.loss_pct:
        args += ["loss", f"{link.loss_pct:g}%"]
    return args


def shape_link(link: LinkSpec, node_namespace: str, node_interface: str, switch_namespace: str,
               switch_port: str, netem: bool = True) -> None:
    """Put ``link``'s qdiscs on both ends of one node's veth (see the module's docstring), in place
    of whatever shaped it before: a link can be reshaped while traffic crosses it (``tc qdisc
    replace`` swaps the root qdisc; packets queued in the old one are dropped, as a NIC's
    renegotiation would).

    ``netem`` (what `netem_shapes` says): False shapes the rate alone, whatever the link asks for.

    Raises:
        TestbedError: a ``tc`` command failed (its stderr is in the message).
    """
    tc_node = ["tc", "-n", node_namespace, "qdisc", "replace", "dev", node_interface]
    if netem and link.needs_netem:
        run_tool([*tc_node, "root", "handle", "1:", *netem_args(link)])
        run_tool([*tc_node, "parent", "1:", "handle", "2:", *tbf_args(link)])
    else:
        run_tool([*tc_node, "root", "handle", "1:", *tbf_args(link)])
    run_tool(["tc", "-n", switch_namespace, "qdisc", "replace", "dev", switch_port, "root", "handle", "1:",
              *tbf_args(link)])
