"""The figures a KV transfer across a shaped link is judged by: its time at line rate, the floor
of what layer streaming can leave exposed, the goodput it reached, and the rates that put the
transfer below, at and above the prefill's compute. Pure arithmetic (no clocks, no I/O): the link
bench (`disaggsdk.calibrate.link_bench`) measures, this module says what the measurements mean.
"""

from __future__ import annotations

BITS_PER_BYTE = 8
# what TCP over Ethernet carries of a link's rate with a 1,500-byte MTU: 1,448 payload bytes (IPv4
# 20 and TCP 20 + 12 of timestamps off the MTU) in 1,514 bytes a tc qdisc counts (the 14-byte
# Ethernet header on top); the most KV goodput a tcp transfer through the testbed can reach
TCP_PAYLOAD_SHARE = 1448 / 1514


def line_transfer_s(num_bytes: float, rate_mbit: float) -> float:
    """Seconds ``num_bytes`` take at ``rate_mbit`` (10^6 bit/s): T, with no header or gap counted.

    Raises:
        ValueError: a rate that is not positive.
    """
    if rate_mbit <= 0:
        raise ValueError(f"line rate {rate_mbit} Mbit/s: give a positive rate")
    return num_bytes * BITS_PER_BYTE / (rate_mbit * 1e6)


def wire_transfer_s(num_bytes: float, rate_mbit: float) -> float:
    """T: ``num_bytes`` through a link of ``rate_mbit`` as TCP carries them (with the TCP/IP and
    Ethernet headers its frames add: `TCP_PAYLOAD_SHARE`), the least time the link allows.

    Raises:
        ValueError: a rate that is not positive.
    """
    return line_transfer_s(num_bytes / TCP_PAYLOAD_SHARE, rate_mbit)


def exposed_floor_s(transfer_s: float, compute_s: float, num_layers: int) -> float:
    """The issue's floor of the transfer left after the forward pass with layer streaming:
    max(T/L, T - C + T/L) (module docstring).

    Raises:
        ValueError: no layers, or a negative time.
    """
    if num_layers < 1 or transfer_s < 0 or compute_s < 0:
        raise ValueError(f"T={transfer_s} s, C={compute_s} s, L={num_layers}: need L >= 1 and times >= 0")
    per_layer_s = transfer_s / num_layers
    return max(per_layer_s, transfer_s - compute_s + per_layer_s)


def strict_exposed_floor_s(transfer_s: float, compute_s: float, num_layers: int) -> float:
    """The strict lower bound of the transfer left after the last layer with layer streaming:
    max(T/L, T - C + C/L). Layer k's pages are ready at k*C/L; a link that cannot keep up starts at
    C/L and stays busy for T, so it ends T - C + C/L after the forward (module docstring).

    Raises:
        ValueError: no layers, or a negative time.
    """
    if num_layers < 1 or transfer_s < 0 or compute_s < 0:
        raise ValueError(f"T={transfer_s} s, C={compute_s} s, L={num_layers}: need L >= 1 and times >= 0")
    return max(transfer_s / num_layers, transfer_s - compute_s + compute_s / num_layers)


def rate_for_ratio_mbit(num_bytes: float, compute_s: float, transfer_to_compute: float) -> float:
    """The line rate (Mbit/s) at which moving ``num_bytes`` takes ``transfer_to_compute`` times the
    compute: T = ratio * C.

    Raises:
        ValueError: a compute time or ratio that is not positive.
    """
    if compute_s <= 0 or transfer_to_compute <= 0:
        raise ValueError(f"C={compute_s} s, T/C={transfer_to_compute}: both must be positive")
    return num_bytes * BITS_PER_BYTE / (transfer_to_compute * compute_s) / 1e6


def goodput_fraction(num_bytes: float, seconds: float, rate_mbit: float) -> float:
    """Bytes delivered per second as a share of the line rate (1.0: every bit of the link carried
    payload; TCP/IP and Ethernet headers alone keep a 1,500-byte MTU under ~0.95).

    Raises:
        ValueError: a time or rate that is not positive.
    """
    if seconds <= 0:
        raise ValueError(f"{seconds} s: a transfer takes a positive time")
    return line_transfer_s(num_bytes, rate_mbit) / seconds
