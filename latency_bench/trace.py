"""Duty-cycle traces: when each benchmark session arrives, acts, idles and leaves.

A trace is a JSON file (format ``worldcast-trace/1``, documented field by field
in ``latency_bench/traces/README.md``). Each session arrives at ``arrive_s``,
leaves at ``leave_s`` and in between alternates *active* segments (the client
sends actions at ``action_hz`` and wants frames) and *idle* segments (the client
has sent the ``pause`` RPC: a hidden tab, a user who stopped acting). Every
session starts active. Times are seconds from the start of the run.

`generate` draws a synthetic trace: Poisson arrivals, exponential lifetimes,
exponential active periods and heavy-tailed (Lomax) idle periods. The two
shipped traces (realised duty cycle 0.296 and 0.301) were made with::

    python -m worldcast.latency_bench.trace generate --out latency_bench/traces/duty30-short.json \\
        --name duty30-short --duration-s 60 --arrival-rate-hz 0.45 --mean-session-s 50 \\
        --mean-active-s 3 --mean-idle-s 14 --max-sessions 10 --seed 28 \\
        --description "Default latency_bench profile: 10 sessions arriving in the first 20 s, duty cycle ~0.30, 60 s."
    python -m worldcast.latency_bench.trace generate --out latency_bench/traces/duty30-long.json \\
        --name duty30-long --duration-s 300 --arrival-rate-hz 0.15 --mean-session-s 120 \\
        --mean-active-s 3 --mean-idle-s 12 --seed 44 \\
        --description "Steady load: ~11 sessions present at once on average, duty cycle ~0.30, 300 s."

and are inspected with ``python -m worldcast.latency_bench.trace show FILE``.
Why the idle means (14 s, 12 s) exceed the 7 s that 3 / (3 + 7) = 0.30
suggests: see `generate` and ``traces/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

#: The ``format`` string of this version of the trace file.
TRACE_FORMAT = "worldcast-trace/1"
#: Slack, s, when checking that segments meet and cover [arrive_s, leave_s] (JSON floats round-trip exactly,
#: but hand-written or rescaled traces may not).
TIME_TOL_S = 1e-6
#: Ceiling on a session's action rate, Hz: above this a client would flood the control channel.
MAX_ACTION_HZ = 1000.0

#: Generator: the floor, s, of a session's lifetime and of its first active period. A session connects, gets its
#: first frames and acts for at least this long; one that would arrive later than this before the end of the
#: trace is not emitted.
MIN_FIRST_ACTIVE_S = 1.0
#: Generator: the floor, s, of every later drawn active or idle period (two actions at 4 Hz). A last period that
#: the session's departure would cut below this is merged into the period before it.
MIN_PERIOD_S = 0.5
#: Generator: times are rounded to this many decimals (1 ms) so the files read well and round-trip exactly.
_DECIMALS = 3

#: Limits of a trace a benchmark can replay: one day, ten thousand sessions, a 64 MiB file.
MAX_DURATION_S = 86_400.0
MAX_SESSIONS = 10_000
MAX_FILE_BYTES = 64 * 2**20

SegmentState = Literal["active", "idle"]


class Segment(BaseModel):
    """One stretch of a session in one state, over [start_s, end_s)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    start_s: float = Field(ge=0, le=MAX_DURATION_S, description="start, s from the start of the trace")
    end_s: float = Field(ge=0, le=MAX_DURATION_S, description="end (exclusive), s from the start of the trace")
    state: SegmentState = Field(description='"active": sends actions, wants frames; "idle": paused')

    @model_validator(mode="after")
    def _check_order(self) -> Segment:
        if not self.end_s > self.start_s:
            raise ValueError(f"segment ends at {self.end_s} s, not after its start at {self.start_s} s")
        return self

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


class TraceSession(BaseModel):
    """One benchmark session: arrival, departure, and the segments that tile [arrive_s, leave_s]."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                    description="unique within the trace; letters, digits, '_', '.', '-'")
    arrive_s: float = Field(ge=0, le=MAX_DURATION_S, description="connects at, s")
    leave_s: float = Field(ge=0, le=MAX_DURATION_S, description="disconnects at, s")
    seed: int = Field(ge=0, le=2**31 - 1, description="the session's seed (the server's range)")
    action_hz: float = Field(gt=0, le=MAX_ACTION_HZ, description="actions per second while active, Hz")
    segments: list[Segment] = Field(min_length=1, description="sorted, contiguous, alternating, first active")

    @model_validator(mode="after")
    def _check_segments(self) -> TraceSession:
        who = f"session {self.id!r}"
        if not self.leave_s > self.arrive_s:
            raise ValueError(f"{who}: leave_s {self.leave_s} is not after arrive_s {self.arrive_s}")
        segs = self.segments
        if abs(segs[0].start_s - self.arrive_s) > TIME_TOL_S:
            raise ValueError(f"{who}: first segment starts at {segs[0].start_s} s, not at arrive_s {self.arrive_s}")
        if segs[0].state != "active":
            raise ValueError(f"{who}: first segment is {segs[0].state!r}; a session starts by acting ('active')")
        for i in range(1, len(segs)):
            if segs[i].start_s < segs[i - 1].start_s:
                raise ValueError(f"{who}: segments not sorted: segment {i} starts at {segs[i].start_s} s, "
                                 f"before segment {i - 1} at {segs[i - 1].start_s} s")
        for i in range(1, len(segs)):
            prev, seg = segs[i - 1], segs[i]
            if seg.start_s < prev.end_s - TIME_TOL_S:
                raise ValueError(f"{who}: segment {i} starts at {seg.start_s} s, before segment {i - 1} ends at "
                                 f"{prev.end_s} s (overlap)")
            if seg.start_s > prev.end_s + TIME_TOL_S:
                raise ValueError(f"{who}: gap between segment {i - 1} ending at {prev.end_s} s and segment {i} "
                                 f"starting at {seg.start_s} s")
            if seg.state == prev.state:
                raise ValueError(f"{who}: segments {i - 1} and {i} are both {seg.state!r}; merge them "
                                 f"(states alternate, each boundary is a pause or a resume)")
        if abs(segs[-1].end_s - self.leave_s) > TIME_TOL_S:
            raise ValueError(f"{who}: last segment ends at {segs[-1].end_s} s, not at leave_s {self.leave_s}")
        return self

    @property
    def present_s(self) -> float:
        """Time connected, s."""
        return self.leave_s - self.arrive_s

    @property
    def active_s(self) -> float:
        """Time spent active, s."""
        return sum(s.length_s for s in self.segments if s.state == "active")

    def state_at(self, t_s: float) -> SegmentState | None:
        """The state at `t_s` (segments are half-open), or None when not connected."""
        for s in self.segments:
            if s.start_s <= t_s < s.end_s:
                return s.state
        return None


class Trace(BaseModel):
    """A benchmark workload: sessions with their arrival, departure and active/idle segments.

    Example:
        >>> trace = load_trace("latency_bench/traces/duty30-short.json")
        >>> trace.duty_cycle(), trace.peak_active()
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    format: str = Field(description=f"always {TRACE_FORMAT!r}")
    name: str = Field(min_length=1)
    description: str = ""
    duration_s: float = Field(gt=0, le=MAX_DURATION_S, description="length of the run, s; every session leaves by then")
    generator: dict[str, Any] | None = Field(default=None, description="`generate`'s parameters, or null")
    sessions: list[TraceSession] = Field(min_length=1, max_length=MAX_SESSIONS)

    @field_validator("format")
    @classmethod
    def _check_format(cls, v: str) -> str:
        if v != TRACE_FORMAT:
            raise ValueError(f"unsupported trace format {v!r}; expected {TRACE_FORMAT!r}")
        return v

    @model_validator(mode="after")
    def _check_sessions(self) -> Trace:
        seen: set[str] = set()
        for s in self.sessions:
            if s.id in seen:
                raise ValueError(f"duplicate session id {s.id!r}")
            seen.add(s.id)
            if s.leave_s > self.duration_s + TIME_TOL_S:
                raise ValueError(f"session {s.id!r}: leave_s {s.leave_s} is after the trace's duration_s "
                                 f"{self.duration_s}")
        return self

    # ---- measurements -------------------------------------------------------------------------------------

    def duty_cycle(self) -> float:
        """Active time over present (connected) time, summed over all sessions; in [0, 1]."""
        return sum(s.active_s for s in self.sessions) / sum(s.present_s for s in self.sessions)

    def active_at(self, t_s: float) -> int:
        """Number of sessions active at `t_s` (segments are half-open: [start_s, end_s))."""
        return sum(1 for s in self.sessions if s.state_at(t_s) == "active")

    def present_at(self, t_s: float) -> int:
        """Number of sessions connected at `t_s` (arrive_s <= t_s < leave_s)."""
        return sum(1 for s in self.sessions if s.arrive_s <= t_s < s.leave_s)

    def peak_active(self) -> int:
        """Most sessions active at the same instant (exact, by sweeping segment boundaries)."""
        return peak_overlap([(g.start_s, g.end_s) for s in self.sessions for g in s.segments if g.state == "active"])

    def peak_present(self) -> int:
        """Most sessions connected at the same instant."""
        return peak_overlap([(s.arrive_s, s.leave_s) for s in self.sessions])

    def mean_active(self) -> float:
        """Time-averaged number of active sessions over [0, duration_s]."""
        return sum(s.active_s for s in self.sessions) / self.duration_s

    def mean_present(self) -> float:
        """Time-averaged number of connected sessions over [0, duration_s]."""
        return sum(s.present_s for s in self.sessions) / self.duration_s

    def concurrency(self, step_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Active and present session counts sampled every `step_s` seconds.

        Returns:
            times: (T,) float64, s: 0, step_s, 2 step_s, ... < duration_s.
            active: (T,) int64, sessions active at each time.
            present: (T,) int64, sessions connected at each time.
        """
        if not (step_s > 0 and math.isfinite(step_s)):
            raise ValueError(f"step_s must be positive and finite, got {step_s}")
        times = np.arange(0.0, self.duration_s, step_s)  # (T,)
        active = np.zeros(times.shape, dtype=np.int64)  # (T,)
        present = np.zeros(times.shape, dtype=np.int64)  # (T,)
        for s in self.sessions:
            present += (times >= s.arrive_s) & (times < s.leave_s)
            for g in s.segments:
                if g.state == "active":
                    active += (times >= g.start_s) & (times < g.end_s)
        return times, active, present

    # ---- I/O ------------------------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The trace as JSON text, one segment per line."""
        text = json.dumps(self.model_dump(mode="json"), indent=2)
        return _SEGMENT_RE.sub(r'{"start_s": \1, "end_s": \2, "state": "\3"}', text) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the trace to `path` as JSON (see `to_json`)."""
        Path(path).write_text(self.to_json())


_SEGMENT_RE = re.compile(r'\{\s*"start_s": ([^,\s]+),\s*"end_s": ([^,\s]+),\s*"state": "(\w+)"\s*\}')


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """Largest number of half-open intervals [a, b) covering one instant."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])  # ends sort before starts
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file.

    Raises:
        ValueError: the file cannot be read, is too large, is not UTF-8 JSON or not a valid trace; the message
            names the file, the field and the reason.
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise ValueError(f"{path}: not a file")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path}: over {MAX_FILE_BYTES // 2**20} MiB; not a trace this tool replays")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the trace: {e}") from None
    try:
        return Trace.model_validate_json(text)
    except ValidationError as e:
        reasons = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '<trace>'}: {err['msg']}" for err in e.errors())
        raise ValueError(f"{path}: invalid trace: {reasons}") from e


# ---- generator ---------------------------------------------------------------------------------------------


def generate(
    *,
    duration_s: float,
    arrival_rate_hz: float,
    mean_session_s: float,
    mean_active_s: float,
    mean_idle_s: float,
    idle_shape: float = 1.5,
    action_hz: float = 4.0,
    max_sessions: int | None = None,
    seed: int = 0,
    name: str = "generated",
    description: str = "",
) -> Trace:
    """Draw a synthetic duty-cycle trace; the same arguments give the same trace.

    - Arrivals: a Poisson process of rate `arrival_rate_hz` over [0, duration_s) (exponential inter-arrival
      times, mean 1 / arrival_rate_hz), at most `max_sessions` of them.
    - Lifetime: exponential with mean `mean_session_s`, floored at `MIN_FIRST_ACTIVE_S` and cut at `duration_s`.
      A session arriving less than `MIN_FIRST_ACTIVE_S` before the end is not emitted.
    - Inside, periods alternate, starting active. Active periods: exponential, mean `mean_active_s`. Idle
      periods: Lomax (Pareto type II) with shape a = `idle_shape` > 1 and scale lambda = mean_idle_s * (a - 1),
      since a Lomax's mean is lambda / (a - 1); its tail P(X > x) = (1 + x / lambda)^-a is heavy (infinite
      variance for a <= 2): most pauses are short, a few are very long. The first active period is floored at
      `MIN_FIRST_ACTIVE_S`, later periods at `MIN_PERIOD_S`; the last one is cut at the departure (and merged
      into the one before if that leaves less than `MIN_PERIOD_S`).

    Duty cycle: mean_active_s / (mean_active_s + mean_idle_s) is the long-run value, approached only when
    sessions last many idle scales. Because every session starts active and its departure cuts the heavy idle
    tail, the realised duty of finite sessions is higher: with 3 s / 7 s (nominal 0.30) the median over seeds
    is about 0.45 for the short trace's ~30 s sessions and 0.39 for the long trace's. For a Lomax cut at L the
    mean idle is only mean_idle_s * (1 - (1 + L / lambda)^(1 - a)). So choose mean_idle_s for the realised
    value (`Trace.duty_cycle`), and expect a short trace to scatter widely around it across seeds.

    Args:
        duration_s: length of the trace, s.
        arrival_rate_hz: session arrivals per second, Hz.
        mean_session_s: mean session lifetime before the cut at duration_s, s.
        mean_active_s: mean active period, s.
        mean_idle_s: mean idle period, s.
        idle_shape: Lomax shape of idle periods (> 1 so the mean exists).
        action_hz: action rate of every session while active, Hz.
        max_sessions: stop after this many sessions (None: no limit).
        seed: seed of the numpy Generator; each session also gets its own client seed drawn from it.
        name, description: stored in the trace.

    Raises:
        ValueError: a parameter out of range, or no session arrived (raise the rate or change the seed).
    """
    params: dict[str, Any] = {
        "kind": "poisson-exp-lomax",
        "duration_s": duration_s, "arrival_rate_hz": arrival_rate_hz, "mean_session_s": mean_session_s,
        "mean_active_s": mean_active_s, "mean_idle_s": mean_idle_s, "idle_shape": idle_shape,
        "action_hz": action_hz, "max_sessions": max_sessions, "seed": seed,
    }
    for key in ("duration_s", "arrival_rate_hz", "mean_session_s", "mean_active_s", "mean_idle_s"):
        if not (params[key] > 0 and math.isfinite(params[key])):
            raise ValueError(f"{key} must be positive and finite, got {params[key]}")
    if not (idle_shape > 1 and math.isfinite(idle_shape)):
        raise ValueError(f"idle_shape must be > 1 (the Lomax mean is scale / (shape - 1)), got {idle_shape}")
    if not 0 < action_hz <= MAX_ACTION_HZ:
        raise ValueError(f"action_hz must be in (0, {MAX_ACTION_HZ}], got {action_hz}")
    if max_sessions is not None and max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1 or None, got {max_sessions}")

    rng = np.random.default_rng(seed)
    idle_scale_s = mean_idle_s * (idle_shape - 1)
    sessions: list[TraceSession] = []
    t = 0.0
    while max_sessions is None or len(sessions) < max_sessions:
        t += rng.exponential(1 / arrival_rate_hz)
        if t >= duration_s:
            break
        arrive_s = round(t, _DECIMALS)
        client_seed = int(rng.integers(0, 2**31 - 1))
        lifetime_s = max(rng.exponential(mean_session_s), MIN_FIRST_ACTIVE_S)
        leave_s = min(round(arrive_s + lifetime_s, _DECIMALS), duration_s)
        if leave_s - arrive_s < MIN_FIRST_ACTIVE_S:
            continue  # arrived too close to the end to act for a second
        # Period boundaries, rounded once so neighbouring segments share them exactly.
        bounds = [arrive_s]
        state: SegmentState = "active"
        while True:
            if state == "active":
                floor = MIN_FIRST_ACTIVE_S if len(bounds) == 1 else MIN_PERIOD_S
                length_s = max(rng.exponential(mean_active_s), floor)
            else:
                length_s = max(rng.pareto(idle_shape) * idle_scale_s, MIN_PERIOD_S)
            end_s = round(bounds[-1] + length_s, _DECIMALS)
            if end_s >= leave_s - MIN_PERIOD_S:
                break  # this period runs to the departure (absorbing a too-short remainder)
            bounds.append(end_s)
            state = "idle" if state == "active" else "active"
        bounds.append(leave_s)
        segments = [Segment(start_s=a, end_s=b, state="active" if i % 2 == 0 else "idle")
                    for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        sessions.append(TraceSession(id=f"s{len(sessions):03d}", arrive_s=arrive_s, leave_s=leave_s,
                                     seed=client_seed, action_hz=action_hz, segments=segments))
    if not sessions:
        raise ValueError(f"no session arrived within {duration_s} s at {arrival_rate_hz} Hz with seed {seed}")
    return Trace(format=TRACE_FORMAT, name=name, description=description, duration_s=duration_s,
                 generator=params, sessions=sessions)


# ---- CLI ---------------------------------------------------------------------------------------------------


def summary(trace: Trace) -> str:
    """A human-readable summary: totals, then one line per session."""
    lines = [
        f"trace {trace.name!r}: {trace.description}" if trace.description else f"trace {trace.name!r}",
        f"duration {trace.duration_s:.1f} s, {len(trace.sessions)} sessions, duty cycle {trace.duty_cycle():.3f}",
        f"active at once: peak {trace.peak_active()}, mean {trace.mean_active():.2f}; "
        f"present at once: peak {trace.peak_present()}, mean {trace.mean_present():.2f}",
        f"{'id':<6} {'arrive_s':>9} {'leave_s':>9} {'active_s':>9} {'duty':>6} {'segs':>5} {'action_hz':>9}",
    ]
    for s in trace.sessions:
        lines.append(f"{s.id:<6} {s.arrive_s:>9.3f} {s.leave_s:>9.3f} {s.active_s:>9.3f} "
                     f"{s.active_s / s.present_s:>6.3f} {len(s.segments):>5} {s.action_hz:>9.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """`generate` a trace file, or `show` one."""
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.trace",
                                 description="Generate or inspect duty-cycle traces.")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="draw a synthetic trace (see `generate`) and write it")
    g.add_argument("--out", type=Path, required=True, help="output JSON file")
    g.add_argument("--duration-s", type=float, required=True, help="trace length, s")
    g.add_argument("--arrival-rate-hz", type=float, default=0.2, help="Poisson arrival rate, Hz")
    g.add_argument("--mean-session-s", type=float, default=60.0, help="mean session lifetime, s")
    g.add_argument("--mean-active-s", type=float, default=3.0, help="mean active period, s")
    g.add_argument("--mean-idle-s", type=float, default=7.0, help="mean idle period (Lomax), s")
    g.add_argument("--idle-shape", type=float, default=1.5, help="Lomax shape of idle periods (> 1)")
    g.add_argument("--action-hz", type=float, default=4.0, help="actions per second while active")
    g.add_argument("--max-sessions", type=int, default=None, help="cap on the number of sessions")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--name", default=None, help="trace name (default: the output file's stem)")
    g.add_argument("--description", default="")
    s = sub.add_parser("show", help="validate a trace and print its sessions, duty cycle and concurrency")
    s.add_argument("path", type=Path)
    args = ap.parse_args(argv)
    if args.command == "generate":
        trace = generate(duration_s=args.duration_s, arrival_rate_hz=args.arrival_rate_hz,
                         mean_session_s=args.mean_session_s, mean_active_s=args.mean_active_s,
                         mean_idle_s=args.mean_idle_s, idle_shape=args.idle_shape, action_hz=args.action_hz,
                         max_sessions=args.max_sessions, seed=args.seed, name=args.name or args.out.stem,
                         description=args.description)
        trace.save(args.out)
    else:
        try:
            trace = load_trace(args.path)
        except ValueError as e:
            ap.error(str(e))
    print(summary(trace))


if __name__ == "__main__":
    main()
