"""KeyframeRequests: receivers asking one shared encode for an IDR, granted at most once per interval.

A WebRTC receiver that lost pictures asks its sender for a new IDR with an RTCP Picture Loss Indication (PLI,
RFC 4585 6.3.1) or a Full Intra Request (FIR, RFC 5104 4.3.1). When many receivers share one encode (WHEP
spectators of one session, `transport/webrtc/encoded_track.py`), every IDR is paid by all of them (an IDR is
several times the bytes of a predicted picture), so one lossy receiver must not be able to make the encode
all intra: requests are granted at most once per `min_interval_s`, and one refused is not remembered (the
receiver asks again, or the encode's next periodic IDR, `transport/media/h264.py`, serves it).

No I/O, no clock of its own: the caller passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Shortest time between two IDRs granted to receivers' requests, s: half the periodic IDR interval
#: (`h264.KEYFRAME_INTERVAL_S`), so receivers' requests at most triple the IDRs a stream carries.
KEYFRAME_REQUEST_INTERVAL_S = 0.5


@dataclass
class KeyframeRequests:
    """Grants receivers' IDR requests of one encode at most once per `min_interval_s`.

    Attributes:
        min_interval_s: shortest time between two grants, s (> 0).
        granted: requests granted.
        refused: requests refused (another was granted less than `min_interval_s` before).
    """

    min_interval_s: float = KEYFRAME_REQUEST_INTERVAL_S
    granted: int = 0
    refused: int = 0
    _last_grant_s: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.min_interval_s < float("inf"):
            raise ValueError(f"min_interval_s must be positive and finite, got {self.min_interval_s}")

    def ask(self, now_s: float) -> bool:
        """A receiver asks for an IDR at time `now_s` (monotonic, s): True if the encode should make one."""
        if self._last_grant_s is not None and now_s - self._last_grant_s < self.min_interval_s:
            self.refused += 1
            return False
        self._last_grant_s = now_s
        self.granted += 1
        return True
