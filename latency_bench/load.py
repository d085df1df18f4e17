"""`load`: replay a duty-cycle trace against a server; SLO attainment and goodput.

Open loop: sessions arrive when the trace says, whatever the server is
doing; load comes from arrivals, never from raising one session's action
rate (a session's chunks are ordered and depend on its state). Each trace
session:

1. at `arrive_s` asks for a session (`POST /v1/sessions`, frames stamped);
   on `503` it waits the `Retry-After` the server gave and asks again, until
   its `leave_s` (then it was never admitted);
2. connects over WebRTC and walks its segments: while *active* it sends
   actions at `action_hz`; at an *idle* segment it sends the `pause` RPC (a
   hidden tab, a user who stopped), at the next active one `resume`;
3. at `leave_s` deletes its session.

Each admitted session is measured over its active segments (`SessionProbe.measure`).
A session is *served within the SLO* when its motion-to-photon p95 and its
delivered frames/s while active meet the `SLO`; SLO attainment is the share
of *arriving* sessions served within it (refused ones count as not served).
Goodput is the frames/s, summed over sessions, that the server delivered on
time (less than one frame period after their presentation time), over the
trace's duration.
Concurrently active sessions are an outcome, reported, not a setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from worldcast.latency_bench import stats
from worldcast.latency_bench.probe import SessionMetrics, SessionProbe, model_fps
from worldcast.latency_bench.trace import Trace, TraceSession, peak_overlap

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SLO:
    """What "served well" means for one session (defaults: a world model at 20 frames/s).

    Attributes:
        mtp_p95_ms: largest motion-to-photon p95, ms.
        min_fps_share: smallest delivered frames/s while active, as a share of the model's fps.
    """

    mtp_p95_ms: float = 250.0
    min_fps_share: float = 0.9

    def met(self, m: SessionMetrics, model_fps: float) -> bool:
        return stats.slo_attained(stats.percentiles(m.mtp_ms)["p95"], m.fps, slo_mtp_ms=self.mtp_p95_ms,
                                  min_fps=self.min_fps_share * model_fps)


@dataclass
class SessionOutcome:
    """What happened to one trace session. Times are seconds since the replay began."""

    id: str
    arrive_s: float
    leave_s: float
    refusals: int = 0  #: 503 answers before admission (or until it left)
    refused_s: list[float] = field(default_factory=list)  #: when each 503 came
    admitted_s: float | None = None  #: when it was admitted (None: never)
    active: list[tuple[float, float]] = field(default_factory=list)  #: measured active windows
    metrics: SessionMetrics | None = None
    error: str | None = None  #: a failure other than a refusal
    frame_times: list[float] = field(default_factory=list)  #: frame arrivals (for timelines)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "arrive_s": self.arrive_s, "leave_s": self.leave_s, "refusals": self.refusals,
                "refused_s": self.refused_s, "admitted_s": self.admitted_s, "active": self.active,
                "error": self.error, "metrics": self.metrics.as_dict() if self.metrics else None,
                "frame_times": [round(t, 3) for t in self.frame_times]}


async def _admit(url: str, ts: TraceSession, t0: float, out: SessionOutcome) -> SessionProbe | None:
    while (now := time.monotonic() - t0) < ts.leave_s:
        try:
            probe = await SessionProbe.open(url, seed=ts.seed, stamped=True)
            out.admitted_s = time.monotonic() - t0
            return probe
        except httpx.HTTPStatusError as e:
            if e.response.status_code != 503:
                raise
            out.refusals += 1
            out.refused_s.append(now)
            wait = float(e.response.headers.get("Retry-After", "1"))
            await asyncio.sleep(max(0.05, min(wait, ts.leave_s - now)))
    return None


async def run_session(url: str, ts: TraceSession, t0: float, *, frame_period_s: float) -> SessionOutcome:
    """Replay one trace session against `url`; `t0` is the replay's start (monotonic, s)."""
    out = SessionOutcome(ts.id, ts.arrive_s, ts.leave_s)
    await asyncio.sleep(max(0.0, t0 + ts.arrive_s - time.monotonic()))
    probe: SessionProbe | None = None
    try:
        probe = await _admit(url, ts, t0, out)
        if probe is None:
            return out
        paused = False
        for seg in ts.segments:
            end_s = min(seg.end_s, ts.leave_s)
            if t0 + end_s <= time.monotonic():
                continue  # admitted late: this segment is already over
            if seg.state == "idle":
                if not paused:
                    await probe.client.rpc("pause")
                    paused = True
                await asyncio.sleep(max(0.0, t0 + end_s - time.monotonic()))
                continue
            if paused:
                await probe.client.rpc("resume")
                paused = False
            start = time.monotonic()
            await probe.act_for(t0 + end_s - start, ts.action_hz)
            out.active.append((start, time.monotonic()))
        out.metrics = probe.measure(out.active, frame_period_s=frame_period_s)
        out.frame_times = [f.arrival_s - t0 for f in probe.frames]
        out.active = [(a - t0, b - t0) for a, b in out.active]
    except Exception as e:  # noqa: BLE001 - one session's failure is a result, not a crash
        logger.warning("load: session %s failed: %r", ts.id, e)
        out.error = repr(e)
    finally:
        if probe is not None:
            with contextlib.suppress(Exception):
                await probe.close()
    return out


@dataclass
class LoadResult:
    """A replay's outcome and its summary."""

    profile: str
    trace: str
    seconds: float
    sessions: list[SessionOutcome]
    summary: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "trace": self.trace, "seconds": self.seconds, "summary": self.summary,
                "sessions": [s.as_dict() for s in self.sessions]}


async def replay(url: str, trace: Trace, *, profile: str = "", slo: SLO = SLO()) -> LoadResult:
    """Replay `trace` against the server at `url` and summarise."""
    fps = await model_fps(url)
    t0 = time.monotonic() + 0.5

    async def bounded(ts: TraceSession) -> SessionOutcome:
        try:  # a session stuck past its departure fails alone; the replay never hangs
            return await asyncio.wait_for(run_session(url, ts, t0, frame_period_s=1.0 / fps), ts.leave_s + 60.0)
        except TimeoutError:
            return SessionOutcome(ts.id, ts.arrive_s, ts.leave_s, error="timed out (stuck past its departure)")

    outcomes = list(await asyncio.gather(*(bounded(ts) for ts in trace.sessions)))
    seconds = time.monotonic() - t0
    return LoadResult(profile, trace.name, seconds, outcomes, summarise(outcomes, trace, slo, fps, seconds))


def summarise(outcomes: list[SessionOutcome], trace: Trace, slo: SLO, model_fps: float,
              seconds: float) -> dict[str, Any]:
    """Aggregate per-session outcomes into the numbers a report prints."""
    measured = [o for o in outcomes if o.metrics is not None and o.metrics.seconds > 0]
    served = [o for o in measured if slo.met(o.metrics, model_fps)]  # type: ignore[arg-type]
    mtp = [x for o in measured for x in o.metrics.mtp_ms]  # type: ignore[union-attr]
    frames = sum(o.metrics.frames for o in measured)  # type: ignore[union-attr]
    on_time = sum(o.metrics.frames * o.metrics.on_time_share for o in measured  # type: ignore[union-attr]
                  if not np.isnan(o.metrics.on_time_share))  # type: ignore[union-attr]
    peak, mean = _concurrency([w for o in outcomes for w in o.active], seconds)
    return {
        "arrived": len(outcomes),
        "admitted": sum(o.admitted_s is not None for o in outcomes),
        "never_admitted": sum(o.admitted_s is None for o in outcomes),
        "refusals_503": sum(o.refusals for o in outcomes),
        "errors": sum(o.error is not None for o in outcomes),
        "served_within_slo": len(served),
        "slo_attainment": len(served) / len(outcomes) if outcomes else float("nan"),
        "slo": {"mtp_p95_ms": slo.mtp_p95_ms, "min_fps": slo.min_fps_share * model_fps},
        "mtp_ms": stats.percentiles(mtp),
        "mtp_source": sorted({o.metrics.mtp_source for o in measured}),  # type: ignore[union-attr]
        "fps_active_mean": float(np.mean([o.metrics.fps for o in measured])) if measured else float("nan"),  # type: ignore[union-attr]
        "frames": frames,
        "on_time_share": on_time / frames if frames else float("nan"),
        "goodput_fps": on_time / trace.duration_s,
        "frames_missing": sum(o.metrics.frames_missing for o in measured),  # type: ignore[union-attr]
        "underruns": sum(o.metrics.underruns for o in measured),  # type: ignore[union-attr]
        "stall_ms": sum(o.metrics.stall_ms for o in measured),  # type: ignore[union-attr]
        "active_sessions_peak": peak,
        "active_sessions_mean": mean,
        "trace_duty_cycle": trace.duty_cycle(),
    }


def _concurrency(windows: list[tuple[float, float]], seconds: float) -> tuple[int, float]:
    """Peak and time-weighted mean of the number of overlapping windows over [0, seconds] (exact)."""
    return peak_overlap(windows), (sum(b - a for a, b in windows) / seconds if seconds > 0 else 0.0)
