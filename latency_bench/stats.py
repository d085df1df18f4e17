"""Measurements over a received video stream: percentiles, frame pacing, RFC 3550 jitter, a viewer model, SLOs.

Pure functions: no I/O, no clock. A stream is described by two aligned sequences in receive order:

- ``arrival_s``: (N,) float, s, when each frame was received (any monotonic clock; non-decreasing);
- ``pts``: (N,) int, the frame's presentation timestamp in ticks of ``clock_rate`` Hz (worldcast uses the
  90 kHz RTP video clock, `worldcast.sessions.clock.VIDEO_CLOCK_RATE`), unwrapped (no 32-bit RTP wrap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from worldcast.sessions.clock import VIDEO_CLOCK_RATE

#: A frame counts as late only if it arrives more than this after its play time, s. Without it, float rounding
#: in "arrival == play time" (a stream that is exactly on time after a stall) would count phantom underruns.
LATE_TOLERANCE_S = 1e-6


def percentiles(xs: Sequence[float] | np.ndarray, qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """Percentiles of `xs` by numpy's default linear interpolation.

    Args:
        xs: (N,) samples, any unit (the result has the same unit).
        qs: percentiles in [0, 100].

    Returns:
        {"p50": ..., "p95": ..., "p99": ...}: one key per q, formatted ``f"p{q:g}"`` (so 99.9 gives "p99.9");
        every value NaN when `xs` is empty.
    """
    a = np.asarray(xs, dtype=np.float64).ravel()  # (N,)
    keys = [f"p{q:g}" for q in qs]
    if a.size == 0:
        return dict.fromkeys(keys, math.nan)
    return {k: float(v) for k, v in zip(keys, np.percentile(a, list(qs)))}


def inter_frame_intervals_ms(arrival_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """Gaps between consecutive frame arrivals.

    Args:
        arrival_s: (N,) receive times, s.

    Returns:
        (max(N - 1, 0),) float64, ms: arrival_s[i + 1] - arrival_s[i].
    """
    a = np.asarray(arrival_s, dtype=np.float64).ravel()  # (N,)
    return np.diff(a) * 1e3  # (N - 1,)


def _stream(arrival_s: Sequence[float] | np.ndarray, pts: Sequence[int] | np.ndarray,
            clock_rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Validate a stream; return arrival times (N,) s and media times (N,) s."""
    a = np.asarray(arrival_s, dtype=np.float64).ravel()  # (N,)
    p = np.asarray(pts).ravel()  # (N,)
    if a.shape != p.shape:
        raise ValueError(f"arrival_s has {a.size} frames but pts has {p.size}")
    if not clock_rate > 0:
        raise ValueError(f"clock_rate must be positive, got {clock_rate} Hz")
    if not np.all(np.isfinite(a)):
        raise ValueError("arrival_s holds a non-finite time")
    if np.any(np.diff(a) < 0):
        raise ValueError("arrival_s must be in receive order (non-decreasing)")
    return a, p.astype(np.float64) / clock_rate


def interarrival_jitter_ms(arrival_s: Sequence[float] | np.ndarray, pts: Sequence[int] | np.ndarray,
                           clock_rate: float = VIDEO_CLOCK_RATE) -> float:
    """RFC 3550 interarrival jitter of a frame stream, ms.

    RFC 3550, section 6.4.1: for consecutive frames i-1, i in receive order, with arrival R and timestamp S
    (both in seconds here), D = (R_i - R_{i-1}) - (S_i - S_{i-1}); the estimate starts at J = 0 and is updated
    as J += (|D| - J) / 16 for every frame after the first. This is the floating-point form of the RFC's
    estimator (its appendix A.8 gives the integer one); the value returned is J after the last frame.

    Args:
        arrival_s: (N,) receive times, s, non-decreasing.
        pts: (N,) presentation timestamps, ticks of `clock_rate`.
        clock_rate: timestamp clock, Hz.

    Returns:
        The jitter estimate, ms (0.0 for fewer than two frames: the RFC's initial value).

    Raises:
        ValueError: lengths differ, a non-finite arrival, or arrivals out of order.
    """
    a, s = _stream(arrival_s, pts, clock_rate)
    d = np.abs(np.diff(a) - np.diff(s))  # (N - 1,) |D|, s
    j = 0.0
    for x in d:
        j += (float(x) - j) / 16
    return j * 1e3


@dataclass(frozen=True)
class ViewerResult:
    """What a viewer (see `simulate_viewer`) experienced."""

    underruns: int
    """Stall events: times the next frame was not there at its play time."""
    stall_ms: float
    """Total time spent stalled, ms."""
    played: int
    """Frames shown."""
    late_dropped: int
    """Frames discarded because their PTS was not above the last accepted frame's."""
    startup_ms: float
    """From the reference time (first arrival, or `requested_s`) to the first frame shown, ms; NaN if none."""


def simulate_viewer(arrival_s: Sequence[float] | np.ndarray, pts: Sequence[int] | np.ndarray, *,
                    clock_rate: float = VIDEO_CLOCK_RATE, start_buffer_ms: float = 100.0,
                    requested_s: float | None = None) -> ViewerResult:
    """Replay a received stream through a simple jitter-buffered player and count its stalls.

    The model:

    1. The player shows the first frame received at T0 = arrival_s[0] + start_buffer_ms, and anchors its media
       clock there: a frame with timestamp S is due at play(S) = T0 + (S - S_0) / clock_rate + shift, where
       shift (s) starts at 0.
    2. Frames are taken in receive order. A frame whose PTS is not strictly above the last accepted frame's is
       dropped (`late_dropped`): it would go back in time.
    3. An accepted frame that arrives by its due time (within `LATE_TOLERANCE_S`) is shown on time. One that
       arrives later is an underrun: the previous frame stays on screen until it arrives, the stall lasts
       arrival - play(S), it is shown on arrival, and shift grows by the stall, so later frames are due
       correspondingly later (the buffer restarts empty, no rebuffering threshold).

    So a one-off gap of G s in an otherwise paced stream with frame interval F s stalls once, for
    max(0, G - F - start_buffer) s; a stream that keeps arriving slower than real time stalls again and again.

    Args:
        arrival_s: (N,) receive times, s, non-decreasing.
        pts: (N,) presentation timestamps, ticks of `clock_rate`.
        clock_rate: timestamp clock, Hz.
        start_buffer_ms: how long the player buffers before showing the first frame, ms (>= 0).
        requested_s: when the viewer asked for the stream (e.g. the SDP answer), on the clock of `arrival_s`;
            `startup_ms` is measured from it. Default: the first arrival, so startup_ms == start_buffer_ms.

    Returns:
        A `ViewerResult`; for an empty stream, zero counts and startup_ms NaN.

    Raises:
        ValueError: lengths differ, a non-finite arrival, arrivals out of order, or a negative buffer.
    """
    if not start_buffer_ms >= 0:
        raise ValueError(f"start_buffer_ms must be >= 0, got {start_buffer_ms}")
    a, s = _stream(arrival_s, pts, clock_rate)
    if a.size == 0:
        return ViewerResult(underruns=0, stall_ms=0.0, played=0, late_dropped=0, startup_ms=math.nan)
    p = np.asarray(pts).ravel()  # integer ticks, for the exact PTS comparison
    t0 = float(a[0]) + start_buffer_ms / 1e3
    shift_s = 0.0
    underruns = dropped = played = 0
    last_pts = p[0]
    for i in range(a.size):
        if i > 0 and p[i] <= last_pts:
            dropped += 1
            continue
        last_pts = p[i]
        due_s = t0 + (s[i] - s[0]) + shift_s
        late_s = float(a[i]) - due_s
        if late_s > LATE_TOLERANCE_S:
            underruns += 1
            shift_s += late_s
        played += 1
    ref_s = float(a[0]) if requested_s is None else requested_s
    return ViewerResult(underruns=underruns, stall_ms=shift_s * 1e3, played=played, late_dropped=dropped,
                        startup_ms=(t0 - ref_s) * 1e3)


def real_time_factor(arrival_s: Sequence[float] | np.ndarray, pts: Sequence[int] | np.ndarray,
                     clock_rate: float = VIDEO_CLOCK_RATE) -> float:
    """Wall time taken to receive the frames over the media time they span.

    (arrival_s[-1] - arrival_s[0]) / ((max(pts) - min(pts)) / clock_rate): 1.0 is real time, above 1 the
    stream arrives slower than it plays (a viewer must stall), below 1 faster (bursts after a stall).

    Args:
        arrival_s: (N,) receive times, s, non-decreasing.
        pts: (N,) presentation timestamps, ticks of `clock_rate`.
        clock_rate: timestamp clock, Hz.

    Returns:
        The ratio (dimensionless); NaN for fewer than two frames or a zero media span.
    """
    a, s = _stream(arrival_s, pts, clock_rate)
    if a.size < 2:
        return math.nan
    media_s = float(s.max() - s.min())
    return float(a[-1] - a[0]) / media_s if media_s > 0 else math.nan


def slo_attained(mtp_p95_ms: float, fps: float, *, slo_mtp_ms: float, min_fps: float) -> bool:
    """Whether a session met its service-level objective: p95 motion-to-photon within `slo_mtp_ms` *and* at least
    `min_fps` delivered frames per second. A NaN measurement (no samples) fails.

    Args:
        mtp_p95_ms: measured 95th-percentile motion-to-photon (action-to-frame) latency, ms.
        fps: measured delivered frames per second, Hz.
        slo_mtp_ms: the latency objective, ms (> 0).
        min_fps: the frame-rate objective, Hz (>= 0).
    """
    if not slo_mtp_ms > 0:
        raise ValueError(f"slo_mtp_ms must be positive, got {slo_mtp_ms}")
    if not min_fps >= 0:
        raise ValueError(f"min_fps must be >= 0, got {min_fps}")
    return bool(mtp_p95_ms <= slo_mtp_ms and fps >= min_fps)
