"""`mtp`: time to first frame, delivered frames/s and action-to-frame latency over WebRTC.

For each of N concurrent sessions (aiortc clients on loopback):
- TTFF: from the SDP answer to the first decoded video frame, ms;
- delivered frames/s: decoded video frames per second over the run;
- action-to-frame latency: from sending action seq k to receiving the first
  frame event whose applied action seq is >= k, ms. The frame event is sent
  when the frame is handed to the video track, so this bounds motion-to-photon
  from below by the video path's encode/transport/decode time. (Reading the
  seq from the decoded pixels is the latency_bench issue's next step.)
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from worldcast.transport.client import WebRTCClient


@dataclass
class SessionResult:
    ttff_ms: float
    frames: int
    seconds: float
    lags_ms: list[float] = field(default_factory=list)
    pts: list[int] = field(default_factory=list)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def run_session(url: str, seconds: float, action_hz: float, seed: int) -> SessionResult:
    c = await WebRTCClient.connect(url, seed=seed)
    try:
        await c.next_frame(timeout_s=30)
        ttff = (time.monotonic() - c.answered_at) * 1e3
        res = SessionResult(ttff_ms=ttff, frames=0, seconds=seconds)
        keys = [["d"], ["w"], ["a"], ["s"]]

        async def actions() -> None:
            i = 0
            while True:
                seq = c.send_action(keys=keys[i % 4])
                t_sent = time.monotonic()
                i += 1
                try:
                    ev = await c.wait_event(
                        lambda m, seq=seq: m.get("event") == "frame" and m["action_seq"] >= seq, 5.0
                    )
                    res.lags_ms.append((ev["received_at"] - t_sent) * 1e3)
                except TimeoutError:
                    pass
                await asyncio.sleep(max(0.0, 1 / action_hz - (time.monotonic() - t_sent)))

        task = asyncio.create_task(actions())
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            f = await c.next_frame()
            res.frames += 1
            res.pts.append(f.pts)
        res.seconds = time.monotonic() - t0
        task.cancel()
        return res
    finally:
        await c.aclose()


async def run(url: str, *, sessions: int, seconds: float, action_hz: float) -> list[SessionResult]:
    return list(await asyncio.gather(*(run_session(url, seconds, action_hz, seed=i) for i in range(sessions))))


def report(results: list[SessionResult]) -> dict[str, float]:
    lags = [x for r in results for x in r.lags_ms]
    return {
        "sessions": len(results),
        "ttff_ms_max": max(r.ttff_ms for r in results),
        "ttff_ms_mean": statistics.mean(r.ttff_ms for r in results),
        "fps_per_session_min": min(r.fps for r in results),
        "fps_per_session_mean": statistics.mean(r.fps for r in results),
        "action_to_frame_ms_p50": pct(lags, 50),
        "action_to_frame_ms_p95": pct(lags, 95),
        "action_to_frame_ms_p99": pct(lags, 99),
        "pts_strictly_increasing": float(all(all(b > a for a, b in zip(r.pts, r.pts[1:])) for r in results)),
    }
