"""MediaClock: a session's presentation timestamps on the 90 kHz RTP video clock.

Frames carry an intended presentation time on the engine's monotonic clock;
the media clock maps it to an integer PTS in units of 1/90000 s (RFC 3551,
section 5: video RTP clock rate 90 kHz) relative to the session's first
frame, and keeps PTS strictly increasing even if two frames map to the same
tick or the engine rebases a late session.
"""

from __future__ import annotations

from fractions import Fraction

#: Time base of every PTS: 1/90000 s.
VIDEO_TIME_BASE = Fraction(1, 90_000)
VIDEO_CLOCK_RATE = 90_000


class MediaClock:
    """Maps presentation times (s, monotonic) to strictly increasing 90 kHz PTS."""

    def __init__(self) -> None:
        self._t0_s: float | None = None
        self._last_pts = -1

    def pts(self, present_at_s: float) -> int:
        """The PTS of a frame presented at `present_at_s`; the first frame gets 0."""
        if self._t0_s is None:
            self._t0_s = present_at_s
        pts = round((present_at_s - self._t0_s) * VIDEO_CLOCK_RATE)
        pts = max(pts, self._last_pts + 1)
        self._last_pts = pts
        return pts

    @property
    def last_pts(self) -> int:
        return self._last_pts
