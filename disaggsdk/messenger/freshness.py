"""Fresh control frames: each sender numbers its frames; a receiver takes each number once.

A captured `PrefillRequest` replayed later would pass its MAC and could write KV into pages that
belong to another request by then. Every frame carries its sender's `PeerId` and a sequence
number inside the MAC (`protocol.encode_message`); `ReplayGuard` accepts a number once, within a
window below the highest seen, like IPsec's anti-replay window: control frames over an RDM
endpoint may arrive out of order, so a strict "greater than the last" would drop honest frames.
A restarted unit is a new `PeerId` (new incarnation) and starts again at 1.
"""

from __future__ import annotations

import itertools

from disaggsdk.messenger import protocol as pr

# how far below the highest sequence number a late frame is still taken; far more than the
# frames one sender can have in flight to one receiver
WINDOW_FRAMES = 4096
UNSEQUENCED = "unsequenced"
REPLAYED = "replayed"
SENDER_MISMATCH = "sender_mismatch"


class FrameNumbers:
    """The sequence numbers of one sender's frames: 1, 2, ..."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def next(self) -> int:
        """The number of the next frame."""
        return next(self._next)


class ReplayGuard:
    """Which (sender, sequence number) pairs were taken; refuses repeats and frames too old to judge."""

    def __init__(self, window_frames: int = WINDOW_FRAMES):
        self.window_frames = window_frames
        self._highest: dict[str, int] = {}
        self._seen: dict[str, set[int]] = {}

    def check(self, sender: str, seq: int) -> str | None:
        """Take frame ``seq`` of ``sender``: None when fresh, else why not (`UNSEQUENCED`, `REPLAYED`).

        A number at or below ``highest - window_frames`` is refused as a replay: it can no
        longer be told apart from one.
        """
        if not sender or seq <= 0:
            return UNSEQUENCED
        highest = self._highest.get(sender, 0)
        seen = self._seen.setdefault(sender, set())
        if seq <= highest - self.window_frames or seq in seen:
            return REPLAYED
        seen.add(seq)
        if seq > highest:
            self._highest[sender] = seq
            floor = seq - self.window_frames
            if len(seen) > 2 * self.window_frames:  # forget what the window no longer needs
                self._seen[sender] = {s for s in seen if s > floor}
        return None


class FrameCodec:
    """One unit's side of the control protocol: seals what it sends, opens what it receives.

    Args:
        sender: this unit's `PeerId` as text.
        secret: the deployment secret.
    """

    def __init__(self, sender: str, secret: bytes):
        self.sender, self.secret = sender, secret
        self._numbers = FrameNumbers()
        self._guard = ReplayGuard()

    def seal(self, message: pr.Message) -> bytes:
        """An authenticated frame of ``message``, numbered next in this unit's sequence."""
        return pr.encode_message(message, self.secret, self.sender, self._numbers.next())

    def open(self, frame: bytes) -> pr.Frame | str:
        """The frame, authenticated and fresh; or why it is refused (a `ProtocolError` name,
        `UNSEQUENCED`, `REPLAYED` or `SENDER_MISMATCH`: the key the receiver counts it under)."""
        try:
            opened = pr.decode_frame(frame, self.secret)
        except pr.ProtocolError as exc:
            return type(exc).__name__
        msg = opened.message
        # the messages that name a decode unit: the one that sent them
        claimed = msg.decode_instance if isinstance(msg, (pr.PrefillRequest, pr.AbortPrefill)) else ""
        if claimed and claimed != opened.sender:  # a frame speaks only for the unit that sealed it
            return SENDER_MISMATCH
        return self._guard.check(opened.sender, opened.seq) or opened
