"""SessionProbe: one benchmark session, and what its user sees, time-stamped on the client.

A probe owns a `WebRTCClient`, reads every decoded video frame as it
arrives (recording arrival time, PTS and, when the session was created with
`stamp_frames`, the frame index and applied action seq read back from the
pixels), and records each action it sends. `measure` turns that record into
the metrics of one session over chosen time windows (its active periods).

Motion-to-photon (MTP) of action seq k = arrival of the first decoded frame
whose stamped action seq is >= k, minus the time k was sent; both on the
client's monotonic clock, so the whole path counts: data channel, queueing,
denoising, decode, VP8 encode, RTP, jitter buffer and VP8 decode. Without
readable stamps it falls back to the frame *event* (sent on the control
channel when the frame enters the video track), which leaves out encode,
transport and decode; the report says which source was used.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from aiortc.mediastreams import MediaStreamError

from worldcast.latency_bench import stats
from worldcast.transport.clients.session_api import action_cycle
from worldcast.transport.clients.webrtc import WebRTCClient
from worldcast.transport.media.stamp import cell_px_for_width, read_stamp

#: The 90 kHz RTP video clock of frame PTS (RFC 3551).
CLOCK_RATE = 90_000
#: How long closing a probe (deleting its session, closing the peer) may take, s.
CLOSE_TIMEOUT_S = 15.0


async def model_fps(url: str) -> float:
    """The served model's frame rate, from `GET /v1/model`.

    Raises:
        RuntimeError: `url` does not answer like a worldcast server.
    """
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        r = await http.get("/v1/model")
    try:
        fps = r.raise_for_status().json()["fps"]
    except (httpx.HTTPStatusError, ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"{url} is not a worldcast server: GET /v1/model gave {r.status_code} "
                           f"({type(e).__name__})") from None
    if not isinstance(fps, int | float) or isinstance(fps, bool) or not 0 < fps <= 1000:
        raise RuntimeError(f"{url} is not a worldcast server: /v1/model fps is {fps!r}")
    return float(fps)


@dataclass(frozen=True)
class FrameRecord:
    """One decoded frame as the client received it.

    Attributes:
        arrival_s: client monotonic time the decoded frame came out of the track, s.
        pts: presentation timestamp, 90 kHz units.
        frame_index: frame index read from the pixels (None: not stamped or unreadable).
        action_seq: applied action seq read from the pixels (None: not stamped or unreadable).
    """

    arrival_s: float
    pts: int
    frame_index: int | None
    action_seq: int | None


@dataclass
class SessionMetrics:
    """Metrics of one session over its measured windows. Times in ms, rates in frames/s."""

    ttff_ms: float
    frames: int
    seconds: float  #: measured time, s (windows less their settling time)
    fps: float
    mtp_ms: list[float]
    mtp_source: str  #: "pixels" or "frame-event"
    actions_unanswered: int  #: actions never seen applied in a received frame
    ifi_ms: dict[str, float]  #: inter-frame interval percentiles
    jitter_ms: float  #: RFC 3550 interarrival jitter
    rtf: float  #: real-time factor: wall time over media time of the received frames
    underruns: int  #: viewer stalls with the start buffer
    stall_ms: float  #: total viewer stall time
    on_time_share: float  #: frames delivered by the server less than one frame period late
    stamps_read: float  #: share of frames whose stamp was read (0 when not stamped)
    frames_missing: int  #: gaps in the stamped frame indices: generated but never shown (dropped or lost)
    stages_ms: dict[str, float] = field(default_factory=dict)  #: p50 per server stage, + delivery

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["mtp_ms"] = stats.percentiles(self.mtp_ms)
        return d


class SessionProbe:
    """A WebRTC session driven by the benchmark. Create with `open`."""

    def __init__(self, client: Any, *, stamped: bool) -> None:
        self.client = client
        self.stamped = stamped
        self.frames: list[FrameRecord] = []
        self.actions: list[tuple[int, float]] = []  #: (seq, sent at, s)
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._keys = action_cycle(getattr(client, "model", None) or {})  # from the model's declared keys

    @classmethod
    async def open(cls, url: str, *, seed: int, stamped: bool = True, transport: str = "webrtc") -> SessionProbe:
        """Create a session, connect, and start reading frames.

        Args:
            transport: "webrtc" (aiortc client) or "livekit" (the Python LiveKit SDK as the session's
                user in a room of its own, frames through the SFU; `transport/clients/livekit.py`).

        Raises:
            httpx.HTTPStatusError: creation refused (503 with Retry-After when over capacity).
        """
        client: Any
        if transport == "livekit":
            from worldcast.transport.clients.livekit import LiveKitUser

            client = await LiveKitUser.create(url, room=f"bench-{seed}-{secrets.token_hex(4)}", seed=seed,
                                              stamp_frames=stamped)
        else:
            client = await WebRTCClient.connect(url, seed=seed, stamp_frames=stamped)
        p = cls(client, stamped=stamped)
        p._reader = asyncio.create_task(p._read(), name=f"probe-{client.session_id}")
        return p

    async def _read(self) -> None:
        while not self._closing:
            try:
                f = await self.client.next_frame(timeout_s=3600)
            except (MediaStreamError, ConnectionError):  # the track ended: the peer closed
                return
            now = time.monotonic()
            s = None
            if self.stamped:
                luma = f.to_ndarray(format="gray")
                s = read_stamp(luma, cell_px=cell_px_for_width(luma.shape[1]))
            self.frames.append(FrameRecord(now, int(f.pts), s.frame_index if s else None,
                                           s.action_seq if s else None))

    async def first_frame(self, timeout_s: float = 30.0) -> FrameRecord:
        """Wait for the first decoded frame.

        Raises:
            TimeoutError: none within `timeout_s` (or the reader stopped).
        """
        deadline = time.monotonic() + timeout_s
        while not self.frames:
            if time.monotonic() > deadline or (self._reader is not None and self._reader.done()):
                raise TimeoutError(f"session {self.client.session_id}: no video frame within {timeout_s:.0f} s")
            await asyncio.sleep(0.01)
        return self.frames[0]

    def act(self) -> int:
        """Send the next action (cycling through the model's first declared keys); returns its seq."""
        seq = self.client.send_action(keys=self._keys[(self.client.seq + 1) % len(self._keys)])
        self.actions.append((seq, self.client.sent_at[seq]))
        return seq

    async def act_for(self, seconds: float, action_hz: float) -> None:
        """Send actions at `action_hz` for `seconds`."""
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            self.act()
            await asyncio.sleep(min(1.0 / action_hz, max(0.0, end - now)))

    async def close(self) -> None:
        """Stop reading, delete the session and close the peer (bounded by CLOSE_TIMEOUT_S)."""
        self._closing = True
        if self._reader is not None:
            # Python 3.11's wait_for (inside next_frame) can swallow a cancel that races a frame's
            # arrival (CPython gh-86296), so never wait on the reader unboundedly: the flag ends
            # its loop, the peer's closing ends its recv
            self._reader.cancel()
            await asyncio.wait({self._reader}, timeout=2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.aclose(), CLOSE_TIMEOUT_S)

    # -- metrics ----------------------------------------------------------------------------------

    def measure(self, windows: list[tuple[float, float]], *, frame_period_s: float,
                start_buffer_ms: float = 100.0, settle_s: float = 0.2, grace_s: float = 0.5) -> SessionMetrics:
        """Metrics over `windows` (client monotonic (start, end) pairs, s).

        Frames/s counts frames from `settle_s` after each window starts (a resumed
        session's first frame takes a chunk's lead time; TTFF reports that). An
        action counts as answered only by a frame arriving before its window ends
        plus `grace_s`: the last keys before a pause may never be applied, and
        must not show up as a latency of the whole idle period.
        """
        def inside(t: float) -> bool:
            return any(a <= t < b for a, b in windows)

        settled = [(a + settle_s, b) for a, b in windows if b - a > settle_s]
        seconds = sum(b - a for a, b in settled)
        frames = [f for f in self.frames if inside(f.arrival_s)]
        n_settled = sum(1 for f in frames if any(a <= f.arrival_s < b for a, b in settled))
        ttff = (self.frames[0].arrival_s - self.client.answered_at) * 1e3 if self.frames else float("nan")
        read = sum(f.action_seq is not None for f in self.frames)
        use_pixels = self.stamped and read > 0
        mtp, unanswered = self._mtp(
            [(q, t, next(b for a, b in windows if a <= t < b) + grace_s) for q, t in self.actions if inside(t)],
            use_pixels)
        arr_by_window = [[f for f in frames if a <= f.arrival_s < b] for a, b in windows]
        ifis = np.concatenate([stats.inter_frame_intervals_ms([f.arrival_s for f in w]) for w in arr_by_window
                               if len(w) > 1] or [np.zeros(0)])
        underruns, stall = 0, 0.0
        for w in arr_by_window:
            if w:
                v = stats.simulate_viewer([f.arrival_s for f in w], [f.pts for f in w], clock_rate=CLOCK_RATE,
                                          start_buffer_ms=start_buffer_ms)
                underruns, stall = underruns + v.underruns, stall + v.stall_ms
        events = [e for e in self.client.frame_events if inside(e["received_at"])]
        late = [e["lateness_ms"] for e in events if "lateness_ms" in e]
        return SessionMetrics(
            ttff_ms=ttff,
            frames=len(frames),
            seconds=seconds,
            fps=n_settled / seconds if seconds > 0 else float("nan"),
            mtp_ms=mtp,
            mtp_source="pixels" if use_pixels else "frame-event",
            actions_unanswered=unanswered,
            ifi_ms=stats.percentiles(ifis),
            jitter_ms=stats.interarrival_jitter_ms([f.arrival_s for f in frames], [f.pts for f in frames],
                                                   clock_rate=CLOCK_RATE) if len(frames) > 1 else float("nan"),
            rtf=stats.real_time_factor([f.arrival_s for f in frames], [f.pts for f in frames],
                                       clock_rate=CLOCK_RATE) if len(frames) > 1 else float("nan"),
            underruns=underruns,
            stall_ms=stall,
            on_time_share=float(np.mean([x < frame_period_s * 1e3 for x in late])) if late else float("nan"),
            stamps_read=read / len(self.frames) if self.frames and self.stamped else 0.0,
            frames_missing=_gaps([f.frame_index for f in frames if f.frame_index is not None]),
            stages_ms=self._stages(events, frames),
        )

    def _mtp(self, actions: list[tuple[int, float, float]], use_pixels: bool) -> tuple[list[float], int]:
        """For each (seq, sent_s, answer_by_s): ms until the first frame (or frame event) that
        applied it, if that came by `answer_by_s`; returns (latencies, count unanswered)."""
        if use_pixels:
            seen = [(f.arrival_s, f.action_seq) for f in self.frames if f.action_seq is not None]
        else:
            seen = [(e["received_at"], e["action_seq"]) for e in self.client.frame_events]
        times = [t for t, _ in seen]
        out, unanswered = [], 0
        for seq, sent, by in actions:
            i = bisect.bisect_right(times, sent)
            while i < len(seen) and seen[i][1] < seq:
                i += 1
            if i < len(seen) and seen[i][0] <= by:
                out.append((seen[i][0] - sent) * 1e3)
            else:
                unanswered += 1
        return out, unanswered

    def _stages(self, events: list[dict[str, Any]], frames: list[FrameRecord]) -> dict[str, float]:
        """Server stage p50s from frame events, and the delivery stage (event to decoded frame) joined
        by frame index: the time from handing the frame to the track to having it decoded."""
        out: dict[str, float] = {}
        for k in ("queue", "denoise", "decode", "ipc"):  # ipc: only from an engine in its own process
            xs = [e["timings_ms"][k] for e in events if k in e.get("timings_ms", {})]
            out[k] = float(np.median(xs)) if xs else float("nan")
        by_index = {e["frame_index"]: e["received_at"] for e in events}
        deliv = [(f.arrival_s - by_index[f.frame_index]) * 1e3 for f in frames
                 if f.frame_index is not None and f.frame_index in by_index]
        out["event_to_decoded"] = float(np.median(deliv)) if deliv else float("nan")
        return out


def _gaps(indices: list[int]) -> int:
    """Frame indices skipped between consecutive received frames (a flush or a pause skips none:
    frame indices count generated frames only)."""
    return sum(max(0, b - a - 1) for a, b in zip(indices, indices[1:]))
