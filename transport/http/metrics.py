"""Prometheus metrics (prometheus-client), served at GET /metrics in the text format.

The API port's `/metrics` carries aggregate series only; session ids (per-session series, opt-in and
bounded) appear only on a separate listener (`MetricsConfig`: `worldcast serve --metrics-port`).

Histograms and counters are fed by hooks (device worker steps, frame
deliveries, admission decisions); gauges are read from live objects at
scrape time by a custom collector, so they are never stale.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from worldcast.engine.step_output import StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.tuning.warmup import WarmupReport
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import SessionState

STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
LATENESS_BUCKETS_S = (-0.05, -0.02, -0.01, 0.0, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0)


class _Union(Collector):
    """Every series of another registry (so the listener serves the aggregates without registering twice)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        yield from self.registry.collect()


def process_rss_bytes(pid: int) -> float | None:
    """Resident memory of process `pid`, bytes: `/proc/<pid>/statm`'s resident pages times the page size
    (proc(5)); None where it cannot be read (no such process, not Linux)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return None


class _LiveCollector(Collector):
    def __init__(self, manager: SessionManager, metrics: Metrics) -> None:
        self.m = manager
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        m = self.m
        loop = m.loop
        if loop is not None and not loop.is_closed():
            yield GaugeMetricFamily("worldcast_event_loop_tasks", "asyncio tasks on the server's event loop",
                                    value=len(asyncio.all_tasks(loop)))
        yield GaugeMetricFamily("worldcast_threads", "Threads of the server process", value=threading.active_count())
        if self.metrics.peer_count is not None:
            yield GaugeMetricFamily("worldcast_peer_connections", "WebRTC peer connections not yet closed",
                                    value=self.metrics.peer_count())
        states = GaugeMetricFamily("worldcast_sessions", "Open sessions by state", labels=["state"])
        counts = {s.name.lower(): 0 for s in SessionState if s != SessionState.CLOSED}
        for s in list(m.sessions.values()):
            if s.state != SessionState.CLOSED:
                counts[s.state.name.lower()] += 1
        for k, v in counts.items():
            states.add_metric([k], v)
        yield states
        spectators = GaugeMetricFamily("worldcast_spectators", "Live spectator streams (view-only: WHEP peers, "
                                       "read-only fMP4 streams), all sessions", labels=["kind"])
        kinds = {"whep": 0, "fmp4": 0}
        tokens = 0
        for s in list(m.sessions.values()):  # derived from each session's own record (sessions/viewers.py)
            tokens += len(s.viewers)
            for sp in list(s.viewers.spectators):
                kinds[sp.kind] = kinds.get(sp.kind, 0) + 1
        for k, v in kinds.items():
            spectators.add_metric([k], v)
        yield spectators
        yield GaugeMetricFamily("worldcast_viewer_tokens", "Live viewer tokens, all sessions", value=tokens)
        engines = m.engines
        snaps = [e.snapshot for e in engines]  # each published whole by its engine: consistent, never mutated
        kv = GaugeMetricFamily("worldcast_kv_pool_bytes", "State pool bytes (KV rings and all other declared "
                               "per-session state), all engines", labels=["kind"])
        kv.add_metric(["used"], sum(s.used_bytes for s in snaps))
        kv.add_metric(["budget"], sum(s.budget_bytes for s in snaps))
        yield kv
        yield GaugeMetricFamily("worldcast_scheduler_queue_depth", "Sessions with a step ready or a chunk staged, "
                                "all engines", value=sum(s.queue_depth for s in snaps))
        up = m.engines_up
        yield GaugeMetricFamily("worldcast_device_worker_alive", "1 if an engine's device worker runs",
                                value=1.0 if up else 0.0)
        yield GaugeMetricFamily("worldcast_engines_up", "Engine cores ready to serve", value=up)
        yield GaugeMetricFamily("worldcast_engines_total", "Engine cores configured", value=len(engines))
        by_state = GaugeMetricFamily("worldcast_engine_state", "1 for each engine core's current state",
                                     labels=["engine", "device", "state"])
        per_sessions = GaugeMetricFamily("worldcast_engine_sessions", "Sessions on each engine core", labels=["engine"])
        per_kv = GaugeMetricFamily("worldcast_engine_kv_pool_bytes", "State pool bytes per engine core",
                                   labels=["engine", "kind"])
        restarts = CounterMetricFamily("worldcast_engine_restarts", "Restarts of each engine core after a loss",
                                       labels=["engine"])
        losses = CounterMetricFamily("worldcast_engine_losses", "Deaths of each engine core", labels=["engine"])
        stalls = CounterMetricFamily("worldcast_engine_stalls", "Times each engine core was marked stalled (its "
                                     "device loop made no progress for --stall-after)", labels=["engine"])
        rss = GaugeMetricFamily("worldcast_engine_process_resident_memory_bytes", "Resident memory of each engine "
                                "core running in a process of its own, bytes (Linux /proc)", labels=["engine"])
        for e, snap in zip(engines, snaps, strict=True):
            eid = str(e.id)
            by_state.add_metric([eid, e.device, e.state], 1.0)
            per_sessions.add_metric([eid], len(e.session_ids))
            per_kv.add_metric([eid, "used"], snap.used_bytes)
            per_kv.add_metric([eid, "budget"], snap.budget_bytes)
            restarts.add_metric([eid], e.restarts)
            losses.add_metric([eid], e.losses)
            stalls.add_metric([eid], e.stalls)
            if e.process and e.pid is not None and (b := process_rss_bytes(e.pid)) is not None:
                rss.add_metric([eid], b)
        yield from (by_state, per_sessions, per_kv, restarts, losses, stalls, rss)
        ready = [e for e in engines if e.ready]
        yield GaugeMetricFamily("worldcast_device_degraded", "1 if the measured costs say no engine can carry "
                                "one session in real time (each then serves one session at a time)",
                                value=1.0 if ready and all(e.degraded for e in ready) else 0.0)
        first = ready[0] if ready else engines[0]
        choice = first.thread_choice
        if choice is not None:
            yield GaugeMetricFamily("worldcast_device_threads", "Torch intra-op threads of the first ready "
                                    "engine's device worker", value=choice.threads)
            per = GaugeMetricFamily("worldcast_device_thread_chunk_seconds",
                                    "Warm-up chunk time measured under each candidate thread count",
                                    labels=["threads"])
            for n, sec in sorted(choice.chunk_s.items()):
                per.add_metric([str(n)], sec)
            yield per
        snap = first.snapshot
        if snap.warmup is not None:
            yield from _warmup_metrics(snap.warmup)
        adm = m.admission_decision()
        yield GaugeMetricFamily("worldcast_admission_active_capacity",
                                "Sessions the device carries generating at once, by the cost model",
                                value=adm.active_capacity)
        yield GaugeMetricFamily("worldcast_admission_overload_probability",
                                "Share of time more sessions would generate than fit, if one more were admitted",
                                value=adm.overload_probability)
        yield GaugeMetricFamily("worldcast_admission_duty_prior",
                                "Duty cycle charged to a session not yet measured", value=m.duty_prior.value(
                                    m.measured_loads()))
        cost = GaugeMetricFamily("worldcast_cost_model_step_seconds", "Cost model of the first ready engine: "
                                 "predicted step time", labels=["kind", "batch"])
        for (kind, batch), (sec, _n) in sorted(snap.cost.snapshot().items()):
            cost.add_metric([kind, str(batch)], sec)
        yield cost


class _SessionCollector(Collector):
    """Per-session series (labels carry session ids): only on the metrics listener, only when opted in,
    and for at most `max_sessions` sessions (the newest), so the label set stays bounded."""

    def __init__(self, manager: SessionManager, max_sessions: int) -> None:
        self.m, self.max_sessions = manager, max_sessions

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        m = self.m
        frames = CounterMetricFamily("worldcast_session_frames", "Frames delivered per session",
                                     labels=["session"])
        late = CounterMetricFamily("worldcast_session_late_frames", "Frames committed more than one frame period "
                                   "after their presentation time, per session", labels=["session"])
        duty = GaugeMetricFamily("worldcast_session_duty_cycle", "Measured share of time generating",
                                 labels=["session"])
        snaps = [e.snapshot for e in m.engines]
        stats = {sid: st for sn in snaps for sid, st in sn.sessions.items()}
        early = CounterMetricFamily("worldcast_session_early_starts", "Chunks started at once because an input "
                                    "arrived on an idle device, per session", labels=["session"])
        sessions = sorted(m.sessions.items(), key=lambda kv: kv[1].created_s, reverse=True)
        for sid, s in sessions[:self.max_sessions]:
            frames.add_metric([sid], s.frames.delivered)
            late.add_metric([sid], stats.get(sid, {}).get("late_frames", 0.0))
            duty.add_metric([sid], s.duty_cycle())
            early.add_metric([sid], stats.get(sid, {}).get("early_starts", 0.0))
        yield frames
        yield late
        yield duty
        yield early
        yield GaugeMetricFamily("worldcast_session_series_omitted", "Open sessions without per-session series "
                                "(over --metrics-max-sessions)", value=max(0, len(sessions) - self.max_sessions))


def _warmup_metrics(w: WarmupReport) -> Iterator[GaugeMetricFamily]:
    """What the engine's warm-up measured and chose: the served precision, every dtype's chunk time and
    quality, each batch bucket eager, compiled and from packages, and the phases' durations."""
    p = w.precision
    served = GaugeMetricFamily("worldcast_device_precision", "The served compute dtype and how its steps run at "
                               "batch 1 (value 1)", labels=["dtype", "mode"])
    served.add_metric([p.dtype, w.compile_mode if p.compiled else "eager"], 1.0)
    yield served
    chunk = GaugeMetricFamily("worldcast_device_precision_chunk_seconds", "Warm-up chunk time at batch 1 per "
                              "dtype, eager and compiled (thread CPU time on a one-thread CPU)",
                              labels=["dtype", "mode"])
    psnr = GaugeMetricFamily("worldcast_device_precision_psnr_db", "Warm-up quality check: worst frame PSNR against "
                             "the reference dtype's frames (+Inf: identical)", labels=["dtype", "mode"])
    for t in p.trials:
        for mode, sec, db in (("eager", t.eager_s, t.psnr_db), ("compiled", t.compiled_s, t.compiled_psnr_db)):
            if sec is not None:
                chunk.add_metric([t.dtype, mode], sec)
                psnr.add_metric([t.dtype, mode], db)
    yield chunk
    yield psnr
    tol = GaugeMetricFamily("worldcast_device_precision_min_psnr_db", "The model's quality tolerance, dB",
                            value=p.min_psnr_db)
    yield tol
    bucket = GaugeMetricFamily("worldcast_device_bucket_chunk_seconds", "Warm-up chunk time per batch bucket, eager "
                               "and compiled", labels=["batch", "mode"])
    compiled = GaugeMetricFamily("worldcast_device_compiled_bucket", "1 if the batch bucket is served from compiled "
                                 "graphs, else 0 (eager)", labels=["batch"])
    for b in w.buckets:
        bucket.add_metric([str(b.batch), "eager"], b.eager_s)
        if b.compiled_s is not None:
            bucket.add_metric([str(b.batch), "compiled"], b.compiled_s)
        compiled.add_metric([str(b.batch)], 1.0 if b.compiled else 0.0)
    for pk in w.packages:
        if pk.packages_s is not None:
            bucket.add_metric([str(pk.batch), "packages"], pk.packages_s)
    yield bucket
    yield compiled
    packaged = GaugeMetricFamily("worldcast_device_package_bucket", "1 if the batch bucket is served from its "
                                 "ahead-of-time packages (engine/tuning/packages.py), else 0", labels=["batch"])
    for pk in w.packages:
        packaged.add_metric([str(pk.batch)], 1.0 if pk.served else 0.0)
    yield packaged
    phases = GaugeMetricFamily("worldcast_warmup_seconds", "Wall time of each warm-up phase", labels=["phase"])
    for name, sec in w.phases_s.items():
        phases.add_metric([name], sec)
    yield phases


@dataclass(frozen=True)
class MetricsConfig:
    """Where metrics are served.

    `GET /metrics` on the API port always serves the aggregate series (no session ids: an anonymous
    caller learns nothing about which sessions exist). A separate listener (`port`) serves the same
    and, when `per_session` is set, per-session series for at most `max_sessions` sessions.
    """

    port: int | None = None  #: TCP port of the metrics listener (None: none)
    host: str = "127.0.0.1"  #: its bind address (keep it internal)
    per_session: bool = False  #: per-session series (session ids as labels) on the listener
    max_sessions: int = 64  #: at most this many sessions' series (the newest)

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port < 65536:
            raise ValueError(f"metrics port {self.port} out of range")
        if self.per_session and self.port is None:
            raise ValueError("per-session metrics carry session ids: they need a separate listener "
                             "(--metrics-port), never the API port")
        if self.max_sessions < 1:
            raise ValueError("metrics max_sessions must be >= 1")


class Metrics:
    """All of one server's metrics.

    Attributes:
        registry: the aggregate series (no session ids), for `GET /metrics` on the API port.
        internal_registry: the same, plus per-session series when `config.per_session`, for the
            metrics listener (`MetricsConfig.port`).
    """

    def __init__(self, manager: SessionManager, config: MetricsConfig | None = None) -> None:
        self.config = config or MetricsConfig()
        self.registry = CollectorRegistry()
        self.internal_registry = CollectorRegistry()
        self._listener: Any = None
        r = self.registry
        self.step_seconds = Histogram("worldcast_step_seconds", "Device time of one scheduled step", ["kind"],
                                      buckets=STEP_BUCKETS_S, registry=r)
        self.batch_size = Histogram("worldcast_step_batch_size", "Sessions per scheduled step", ["kind"],
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.step_failures = Counter("worldcast_step_failures", "Sessions whose step failed", registry=r)
        self.lateness = Histogram("worldcast_frame_lateness_seconds",
                                  "Delivery time minus presentation time of each delivered frame",
                                  buckets=LATENESS_BUCKETS_S, registry=r)
        self.frames = Counter("worldcast_frames", "Engine frames at session delivery by outcome: delivered, "
                              "dropped_stale (older epoch, closed), dropped_gated (outside a directed segment), "
                              "dropped_lost (an engine process's full frame ring)",
                              ["outcome"], registry=r)
        self.stream_frames = Counter("worldcast_stream_frames", "Frames handed to WebSocket streams (fMP4, "
                                     "Dreamverse) by outcome: sent, or dropped_<reason> (encoder_queue, stale, "
                                     "slow_reader, closed, encoder, unrouted)", ["outcome"], registry=r)
        self.admissions = Counter("worldcast_admission_decisions", "Admission decisions", ["outcome"], registry=r)
        self.input_messages = Counter("worldcast_input_messages", "Client messages by channel (actions, control, "
                                      "stream: any message on a WebSocket before its kind is known) and outcome "
                                      "(accepted, ignored, too_large, rate_limited, parse_error, invalid, closed, "
                                      "internal, dropped after a flood verdict)", ["channel", "outcome"], registry=r)
        self.engines_lost = Counter("worldcast_engines_lost", "Engine cores lost (every engine)", registry=r)
        self.peer_closes = Counter("worldcast_peer_closes", "Peer connections closed, by reason", ["reason"],
                                   registry=r)
        #: open peer connections, set by the app (None: not reported)
        self.peer_count: Callable[[], int] | None = None
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, ... (Linux /proc)
        r.register(_LiveCollector(manager, self))
        self.internal_registry.register(_Union(r))
        if self.config.per_session:
            self.internal_registry.register(_SessionCollector(manager, self.config.max_sessions))

    def start_listener(self) -> int | None:
        """Serve `internal_registry` on `config.port` (a thread of prometheus-client's own HTTP server).

        Returns:
            the port it listens on (None: no listener configured).

        Raises:
            OSError: the port cannot be bound.
        """
        if self.config.port is None:
            return None
        server, _thread = start_http_server(self.config.port, addr=self.config.host, registry=self.internal_registry)
        self._listener = server
        return int(server.server_address[1])

    def stop_listener(self) -> None:
        """Stop the listener (idempotent)."""
        if self._listener is not None:
            self._listener.shutdown()
            self._listener.server_close()
            self._listener = None

    def on_step(self, plan: StepSchedulerOutput, result: StepRunnerOutput) -> None:
        """Device-worker hook (worker thread; prometheus-client is thread-safe)."""
        if plan.kind is None:
            return
        self.step_seconds.labels(plan.kind).observe(result.step_time_s)
        self.batch_size.labels(plan.kind).observe(len(plan.session_ids))
        if result.failed:
            self.step_failures.inc(len(result.failed))

    def on_frame(self, outcome: str, lateness_s: float) -> None:
        """`SessionManager.on_frame`: one engine frame at delivery, by outcome ("delivered", "dropped_stale",
        "dropped_gated"); the lateness (s) of delivered ones."""
        self.frames.labels(outcome).inc()
        if outcome == "delivered":
            self.lateness.observe(lateness_s)

    def on_stream_frames(self, outcome: str, n: int = 1) -> None:
        """A WebSocket stream's `FrameAccount` hook: `n` frames sent or dropped (event loop)."""
        self.stream_frames.labels(outcome).inc(n)

    def on_engine_lost(self, engine: object) -> None:
        """An engine core died (its sessions were told `engine_lost`)."""
        self.engines_lost.inc()

    def on_admission(self, admitted: bool) -> None:
        self.admissions.labels("admitted" if admitted else "refused").inc()

    def on_input(self, channel: str, outcome: str, n: int = 1) -> None:
        """`InputGuard` hook: one client message counted."""
        self.input_messages.labels(channel, outcome).inc(n)

    def on_peer_close(self, reason: str) -> None:
        self.peer_closes.labels(reason).inc()
