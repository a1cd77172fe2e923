"""One request's KV handoff as measured on one side: the record the messengers fill, units ship in
their stats frame, and the benchmark and the TTFT breakdown (`report.ttft_phases`) read.

Pure bookkeeping: no clocks are read here.
"""

from __future__ import annotations

import msgspec


class RequestTransfer(msgspec.Struct, frozen=True):
    """One request's handoff as measured on one side."""

    request_id: str
    side: str  # "prefill" | "decode"
    num_tokens: int
    bytes: int = 0  # prefill: bytes sent (context included)
    writes: int = 0  # prefill: write entries sent
    transfer_s: float = 0.0  # prefill: first write submitted -> last write completed locally
    exposed_s: float = 0.0  # decode: prefill forward ended -> counter fired
    lead_s: float = 0.0  # prefill: first write submitted -> forward ended (> 0: streamed during it)
    attempts: int = 1  # decode: prefill attempts (1 = no retry)
    prefilled_locally: bool = False
    # Where the time to first token went: time.monotonic() of the unit, the one clock of a machine
    # (phases that cross units are only meaningful on one machine). 0.0: not measured.
    arrived_s: float = 0.0  # prefill: its request frame was handled
    forward_start_s: float = 0.0  # prefill: the step with its first chunk began
    forward_end_s: float = 0.0  # both: prefill's forward pass ended (decode: read from the context)
    # prefill: the KV's last layer was complete and its writes submitted (the latest chunk's): what
    # a layer-streamed transfer can at best leave is that layer's share, measured from here
    last_layer_s: float = 0.0
    submitted_s: float = 0.0  # decode: the request reached the decode unit
    sent_s: float = 0.0  # decode: its (last) prefill request was sent
    fired_s: float = 0.0  # decode: its counter fired (every write of it landed)
    admitted_s: float = 0.0  # decode: handed to the engine's scheduler
