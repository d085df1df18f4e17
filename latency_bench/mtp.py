"""`mtp`: motion-to-photon, time to first frame and frame pacing for N always-active sessions.

Each of N concurrent sessions (aiortc clients on loopback, frames stamped
with frame index and action seq) sends actions at `action_hz` for
`seconds` and is measured by `SessionProbe.measure` over that whole
window: TTFF (SDP answer to first decoded frame), motion-to-photon
percentiles read from the decoded pixels, delivered frames/s, inter-frame
intervals, RFC 3550 jitter, real-time factor, viewer underruns with a start
buffer, server on-time share, and the server's per-stage times joined by
frame index.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import numpy as np

from worldcast.latency_bench import stats
from worldcast.latency_bench.probe import SessionMetrics, SessionProbe, model_fps


async def run_session(url: str, *, seconds: float, action_hz: float, seed: int, period_s: float,
                      start_buffer_ms: float, transport: str = "webrtc") -> SessionMetrics:
    p = await SessionProbe.open(url, seed=seed, stamped=True, transport=transport)
    try:
        await p.first_frame(30.0)  # measure from the first frame on
        t0 = time.monotonic()
        await p.act_for(seconds, action_hz)
        await asyncio.sleep(0.5)  # let the last actions show up
        return p.measure([(t0, t0 + seconds)], frame_period_s=period_s, start_buffer_ms=start_buffer_ms)
    finally:
        await p.close()


async def run(url: str, *, sessions: int, seconds: float, action_hz: float,
              start_buffer_ms: float = 100.0, transport: str = "webrtc") -> list[SessionMetrics]:
    """Run N sessions concurrently against `url` over `transport` (webrtc, livekit); one `SessionMetrics` each."""
    fps = await model_fps(url)
    limit = seconds + 90.0  # connect, first frame (30 s), the run, closing: a stuck session fails, never hangs
    return list(await asyncio.gather(*(
        asyncio.wait_for(run_session(url, seconds=seconds, action_hz=action_hz, seed=i, period_s=1.0 / fps,
                                     start_buffer_ms=start_buffer_ms, transport=transport), limit)
        for i in range(sessions))))


def report(results: list[SessionMetrics]) -> dict[str, Any]:
    """Aggregate over sessions: MTP pooled over all actions; per-session numbers as mean / worst."""
    mtp = [x for r in results for x in r.mtp_ms]
    def median(k: str) -> float:
        xs = [r.stages_ms.get(k, float("nan")) for r in results]
        return float(np.nanmedian(xs)) if any(np.isfinite(x) for x in xs) else float("nan")

    stages = {k: median(k) for k in ("queue", "denoise", "decode", "ipc", "event_to_decoded")} if results else {}
    return {
        "sessions": len(results),
        "mtp_ms": stats.percentiles(mtp),
        "mtp_source": sorted({r.mtp_source for r in results}),
        "actions": len(mtp),
        "actions_unanswered": sum(r.actions_unanswered for r in results),
        "ttff_ms_mean": statistics.mean(r.ttff_ms for r in results),
        "ttff_ms_max": max(r.ttff_ms for r in results),
        "fps_mean": statistics.mean(r.fps for r in results),
        "fps_min": min(r.fps for r in results),
        "ifi_ms_p95_max": max(r.ifi_ms["p95"] for r in results),
        "jitter_ms_max": max(r.jitter_ms for r in results),
        "rtf_mean": statistics.mean(r.rtf for r in results),
        "underruns": sum(r.underruns for r in results),
        "stall_ms": sum(r.stall_ms for r in results),
        "on_time_share_min": min(r.on_time_share for r in results),
        "stamps_read_min": min(r.stamps_read for r in results),
        "frames_missing": sum(r.frames_missing for r in results),
        "stages_ms_p50": stages,
    }
