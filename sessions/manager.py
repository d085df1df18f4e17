"""SessionManager: create, look up, idle and close sessions; place them on engines; bridge frames to them.

The manager owns the engines' session membership. Each session runs on one
engine core (`engine/engine_handle.py`: a thread of this process, or a
process of its own per device); placement picks the engine with the most
headroom (`sessions/placement.py`). Frames and errors arrive on engine
threads and are marshalled to the event loop with `call_soon_threadsafe`,
where each session's frame pipeline takes them (`sessions/frames.py`:
pacing, the flush guarantees, PTS, the gate, the sinks), whatever engine
made a frame.
Each session's inputs send their changes through an `EngineLink` the
manager gives them (`_Link`): to the engine the session is placed on, the
same messages for every kind of engine; held while the session moves.

An engine that dies takes only its own sessions: each gets an "error"
event with code `engine_lost` and is closed; sessions elsewhere are not
touched. An engine that stalls (`EngineHandle.watch`) tells its sessions
(`engine_stalled`, an "error" event that closes nothing) and takes no new one. Moving a session between engines is `sessions/moves.py`.

Capacity is held only by a session with a connected viewer, or within a named grace: one that has
never had a viewer is released `SessionConfig.connect_grace_s` after creation (or when its connecting
viewer's own deadline passes), one whose viewers left after `timeout_s` (the reconnect grace); a
refusal's retry hint is the time until the first such release (`release_at_s`, `next_release_in_s`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from worldcast.engine import session_state
from worldcast.engine.admission import AdmissionConfig, AdmissionDecision, DutyCyclePrior, SessionLoad
from worldcast.engine.conditioner import ConditionerState, InputDelta
from worldcast.engine.device_worker import EngineConfig
from worldcast.engine.engine_handle import EngineHandle
from worldcast.engine.errors import EngineUnavailable, SessionStateError, StatePoolExhausted
from worldcast.engine.local_engine import LocalEngine
from worldcast.engine.step_output import FrameOut
from worldcast.engine.tuning.packages import machine_kind
from worldcast.models.base import WorldModel, weights_digest
from worldcast.models.errors import ConditioningError
from worldcast.models.spec import Conditioning, ConditioningRequest
from worldcast.sessions.directing import DirectingSession
from worldcast.sessions.errors import (
    CapacityExhausted,
    EngineNotFound,
    InvalidConditioning,
    RecordingRefused,
    SessionClosedError,
    SessionNotFound,
    SnapshotRefused,
)
from worldcast.sessions.placement import Placement, place
from worldcast.sessions.recording import EventLog, Recordings
from worldcast.sessions.session import CloseReason, Session, SessionMode, SessionState
from worldcast.sessions.snapshots import Snapshot, SnapshotStore
from worldcast.sessions.takes import Takes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionConfig:
    """Session lifecycle settings."""

    idle_after_s: float = 30.0  #: an ACTIVE session without actions goes IDLE after this, s
    #: reconnect grace: a session whose viewers have all left is closed after this long without a viewer
    #: or activity, s
    timeout_s: float = 120.0
    #: connect grace: a session that has never had a connected viewer is closed this long after its creation
    #: (or when its last connecting viewer's own deadline passes, if later: a WebRTC peer's negotiation), s
    connect_grace_s: float = 15.0
    tick_s: float = 1.0  #: housekeeping period, s
    #: frames are handed to sinks no earlier than this many frame periods before their presentation time;
    #: a chunk of many frames (causal Wan: 12) is thus paced out in real time instead of in a burst
    send_ahead_frames: float = 1.0
    warmup: bool = True  #: measure step costs at start (admission and pacing rely on them)
    #: a directing session's kept segment starts ("take it again from segment N", `sessions/takes.py`), bytes of
    #: captured state at most a session (0: no retakes)
    retake_max_bytes: int = 64 * 2**20
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)  #: who gets in

    def __post_init__(self) -> None:
        for name in ("idle_after_s", "timeout_s", "connect_grace_s", "tick_s"):
            v = getattr(self, name)
            if not 0 < v < float("inf"):
                raise ValueError(f"SessionConfig.{name} must be positive and finite, got {v!r}")
        if self.retake_max_bytes < 0:
            raise ValueError(f"SessionConfig.retake_max_bytes must be >= 0, got {self.retake_max_bytes!r}")


class SessionManager:
    """All sessions of one server, and the engines that run them.

    Args:
        model: the world model (this process's copy: action and conditioning encoding, geometry).
        engine_config: device worker settings (of the default engine).
        config: session settings.
        clock: monotonic clock, s.
        engines: the engine cores (None: one `LocalEngine` on `model`'s device). Engines in other
            processes keep time on CLOCK_MONOTONIC, so `clock` must then be `time.monotonic`.
        recordings: where sessions are recorded (`sessions/recording.py`; None: recording is refused).
        snapshots: where snapshots are kept (`sessions/snapshots.py`; None: snapshots are refused).
    """

    def __init__(
        self,
        model: WorldModel,
        *,
        engine_config: EngineConfig,
        config: SessionConfig,
        clock: Callable[[], float] = time.monotonic,
        engines: Sequence[EngineHandle] | None = None,
        recordings: Recordings | None = None,
        snapshots: SnapshotStore | None = None,
    ) -> None:
        self.model = model
        self.recordings = recordings
        self.snapshots = snapshots
        self._weights_sha256: str | None = None
        self.config = config
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.engines: list[EngineHandle] = list(engines) if engines else [
            LocalEngine(0, model, engine_config, clock=clock)]
        if [e.id for e in self.engines] != list(range(len(self.engines))):
            raise ValueError("engine ids must be 0, 1, ... in order")
        for e in self.engines:
            e.on_frames, e.on_lost, e.on_stalled = self._on_frames, self._on_engine_lost, self._on_engine_stalled
            e.on_error = lambda sid, reason, e=e: self._on_error(e, sid, reason)  # type: ignore[misc]
            e.on_resync = self._resync
        self._loop: asyncio.AbstractEventLoop | None = None
        self._creating: dict[int, int] = {}  #: per engine: sessions admitted but not yet on it (encoding)
        #: sessions between two engines (`sessions/moves.py`): their input changes wait here (epoch, wants and
        #: conditioning are sent whole once the target has them: `SessionInputs.resend`)
        self.moving: dict[str, list[InputDelta]] = {}
        #: duty cycle charged to sessions not yet measured: the mean over measured ones
        adm = config.admission
        self.duty_prior = DutyCyclePrior(adm.min_observation_s, default=adm.default_duty_cycle)
        self._tick_task: asyncio.Task[None] | None = None
        #: hooks for metrics: on_frame(outcome, lateness_s) with outcome "delivered" | "dropped_stale" |
        #: "dropped_gated" | "dropped_lost" (`FramePipeline.deliver`), on_admission(admitted), on_engine_lost(engine)
        self.on_frame: Callable[[str, float], None] | None = None
        self.on_admission: Callable[[bool], None] | None = None
        self.on_engine_lost: Callable[[EngineHandle], None] | None = None
        #: called with each session once it is closed (the server trims the heap after closes)
        self.on_close: Callable[[Session], None] | None = None

    def engine(self, engine_id: int) -> EngineHandle:
        """The engine with this id.

        Raises:
            EngineNotFound: no such engine.
        """
        if not 0 <= engine_id < len(self.engines):
            raise EngineNotFound(f"no engine {engine_id}; engines are 0..{len(self.engines) - 1}")
        return self.engines[engine_id]

    def engine_of(self, session_id: str) -> EngineHandle | None:
        """The engine a session runs on (None: unknown, closed, or between two engines). The engines' own
        records are the only one (`EngineHandle.holds`)."""
        for e in self.engines:
            if e.holds(session_id):
                return e
        return None

    async def start(self) -> None:
        """Start every engine (warm-up included) and the housekeeping task.

        Raises:
            EngineUnavailable: an engine could not start.
        """
        self._loop = asyncio.get_running_loop()
        starts = [e.start(warmup=self.config.warmup) for e in self.engines]
        if not self.config.warmup:
            await asyncio.gather(*starts)
        elif not any(e.warmup_shares_interpreter for e in self.engines) and self.model.encoders_on_cpu:
            # the conditioning encoders load now, not on the first user's request: here beside the engines'
            # warm-ups, which run in processes of their own (and choose by thread CPU time: engine/tuning/warmup.py);
            # an encoder on an engine's device would skew what its warm-up measures (memory, step times)
            done = await asyncio.gather(*starts, self._loop.run_in_executor(None, self.model.load_encoders),
                                        return_exceptions=True)  # every start has ended before one is raised
            for r in done:
                if isinstance(r, BaseException):
                    raise r
        else:
            # after the warm-ups: beside an in-process one, loading slowed it down as much as it gained (both
            # are mostly Python holding the interpreter lock; BENCHMARKS, "Start-up to ready")
            await asyncio.gather(*starts)
            await self._loop.run_in_executor(None, self.model.load_encoders)
        self._tick_task = asyncio.create_task(self._tick_loop(), name="session-manager-tick")

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the manager runs on (None before `start`)."""
        return self._loop

    async def aclose(self) -> None:
        """Close every session and stop the engines (idempotent)."""
        if self._tick_task is not None:
            self._tick_task.cancel()
            try:
                await self._tick_task
            except asyncio.CancelledError:
                pass
            self._tick_task = None
        for sid in list(self.sessions):
            self.close(sid, CloseReason.SHUTDOWN)
        await asyncio.gather(*(e.aclose() for e in self.engines))

    # -- lifecycle ---------------------------------------------------------------------------

    def check_conditioning(self, request: ConditioningRequest, *, mode: SessionMode = "interactive") -> None:
        """Check a session's conditioning against what the model accepts, before anything is allocated.

        Raises:
            InvalidConditioning: names the field ("prompt", "image", "mode") and the reason.
        """
        try:
            self.model.spec.conditioning.validate(request)
        except ConditioningError as e:
            raise InvalidConditioning(e.field, e.reason) from None
        if mode == "directing" and self.model.spec.conditioning.text is None:
            raise InvalidConditioning("mode", f"directing needs text directions; {self.model.spec.name} takes "
                                      "no text prompt")

    def _encode(self, request: ConditioningRequest) -> Conditioning:
        try:
            context = self.model.encode_conditioning(request)
        except ConditioningError as e:
            raise InvalidConditioning(e.field, e.reason) from None
        self.model.spec.conditioning.check_encoded(context)
        return context

    async def create(
        self, *, prompt: str | None = None, image: np.ndarray | None = None, seed: int | None = None,
        stamp_frames: bool = False, mode: SessionMode = "interactive", record: bool = False,
        snapshot: Snapshot | None = None,
    ) -> Session:
        """Open a session on the engine with the most headroom; its initial frame is generated at once.

        Args:
            prompt: the text prompt (None: the model's default, for a model that takes text).
            image: uint8 (H, W, 3) RGB starting image, decoded (None: none; a model that needs one
                uses its declared default or refuses).
            stamp_frames: ask its video sinks to stamp frame index and action seq into the pixels.
            mode: "directing" sessions wait for their first direction (paused) and keep their
                segments in the directing layer above it (`sessions/directing.py`, `director_of`).
            record: record it from its first frame (`sessions/recording.py`; replayable).
            snapshot: start it from this snapshot (`sessions/snapshots.py`): its prompt, image, seed and engine
                state; its first frame is the one the snapshotted session made next given the same inputs.

        Raises:
            InvalidConditioning: the prompt, image or mode is refused (checked before admission:
                nothing is allocated).
            CapacityExhausted: too many sessions, no engine with room or a free state slot (retry later).
            RecordingRefused: `record` asked of a server that does not record, or one whose quota is full
                (nothing is allocated).
            SnapshotRefused: the snapshot's state does not fit this server's model, or its restore failed (the
                session is closed: nothing is half restored).
        """
        request = ConditioningRequest(text=prompt or None, image=image)
        context_version = 0
        if snapshot is not None:
            try:
                held = session_state.parse(snapshot.state, self.model.spec).conditioner
            except SessionStateError as e:
                raise SnapshotRefused(f"snapshot {snapshot.snapshot_id}: {e}") from None
            request = ConditioningRequest(text=snapshot.meta.get("prompt"), image=snapshot.image)
            seed, mode = int(snapshot.meta["seed"]), "interactive"
            context_version = 0 if held is None else held.context_version
        if record:
            await self._ready_to_record()
        self.check_conditioning(request, mode=mode)
        placement = self.placement()
        decision = placement.decision
        if self.on_admission is not None:
            self.on_admission(decision.admitted)
        if placement.engine is None:
            logger.info("SessionManager: refused a session: %s", decision.reason)
            raise CapacityExhausted(f"refused: {decision.reason}", retry_after_s=self.next_release_in_s())
        engine = placement.engine
        # counted by admission while we wait, so concurrent creates cannot overshoot
        self._creating[engine.id] = self._creating.get(engine.id, 0) + 1
        try:
            context = await asyncio.get_running_loop().run_in_executor(None, self._encode, request)
        finally:
            self._creating[engine.id] -= 1
        sid = secrets.token_hex(8)
        session = Session(
            sid,
            secrets.token_urlsafe(24),
            model=self.model,
            conditioning=request,
            context=context,
            seed=seed if seed is not None else secrets.randbelow(2**31),
            idle_after_s=self.config.idle_after_s,
            clock=self.clock,
            stamp_frames=stamp_frames,
            mode=mode,
            send_ahead_s=self.config.send_ahead_frames * float(self.model.spec.frame_period),
            context_version=context_version,
        )
        session.frames.on_outcome = self._frame_outcome
        if record:
            self._record(session, engine, from_start=True, snapshot=snapshot)
        if snapshot is not None:
            return await self._restore(session, engine, snapshot)
        director = None
        if mode == "directing":
            director = DirectingSession(session)  # the layer above it (`director_of(session)`), gating its frames
            session.pause()  # nothing to generate until the first direction
        try:
            engine.add_session(sid, session.inputs.engine_state(), seed=session.seed)
        except (StatePoolExhausted, EngineUnavailable) as e:
            self._unrecord(session)
            raise CapacityExhausted(str(e), retry_after_s=self.next_release_in_s()) from e
        except BaseException:
            self._unrecord(session)
            raise
        self.sessions[sid] = session
        session.inputs.attach(_Link(self, sid))
        session.recorder = lambda: self.start_recording(sid)
        if director is not None and self.config.retake_max_bytes:
            self._keep_takes(session, director)
        logger.info("Session(%s): created on engine %d (prompt of %d chars, %s, seed %d)", sid, engine.id,
                    len(prompt or ""), "no image" if image is None else f"a {image.shape[1]}x{image.shape[0]} image",
                    session.seed)
        return session

    # -- takes (directing) -------------------------------------------------------------------------------------

    def _keep_takes(self, session: Session, director: DirectingSession) -> None:
        """Keep the directing session's segment starts, so a segment can be taken again (`sessions/takes.py`)."""
        sid, spec = session.id, self.model.spec

        async def capture() -> bytes:
            engine = self.engine_of(sid)
            if engine is None:
                raise EngineUnavailable(f"session {sid} is between engines")
            return await engine.capture_session(sid)

        takes = Takes(director, capture=capture, rewind=lambda state: self.rewind(sid, state),
                      next_frame=lambda state: spec.pixel_start(session_state.parse(state).header["next_latent"]),
                      max_bytes=self.config.retake_max_bytes)

        def keep(segment: int, state: bytes, epoch: int) -> None:
            if session.recording is not None:
                session.recording.retake(segment, state, epoch)
        takes.on_retake = keep
        takes.keep_start()

    async def rewind(self, session_id: str, state: bytes) -> None:
        """Put an open session's world back to `state` (captured from it earlier), on the engine it is on: it
        keeps its id, token, streams, clock and recording; its schedule moves to now and the server's inputs are
        sent again whole. Frames made before it are stale once its owner flushes (a retake directs at once).

        Raises:
            SessionNotFound: no such open session.
            SnapshotRefused: `state` is not this model's (nothing changes), or the session is between engines.
            SessionClosedError: the engine could not restore it (the session is then closed: its world is gone).
        """
        s = self.get(session_id)
        try:
            session_state.parse(state, self.model.spec)
        except SessionStateError as e:
            raise SnapshotRefused(f"session {session_id}: {e}") from None
        engine = self.engine_of(session_id)
        if engine is None:
            raise SnapshotRefused(f"session {session_id} is between engines; try again in a moment")
        engine.remove_session(session_id)
        try:
            await engine.import_session(session_id, s.inputs.engine_state(), seed=s.seed,
                                        blob=session_state.rebase(state, self.clock()))
        except (StatePoolExhausted, EngineUnavailable, SessionStateError) as e:
            self.close(session_id, CloseReason.ERROR, detail=f"putting its world back failed: {e}")
            raise SessionClosedError(f"session {session_id} closed: its world could not be put back ({e})") from e
        s.inputs.resend()
        logger.info("Session(%s): world put back on engine %d", session_id, engine.id)

    # -- snapshots --------------------------------------------------------------------------------------------

    async def _restore(self, session: Session, engine: EngineHandle, snapshot: Snapshot) -> Session:
        """`create`'s end for a session started from a snapshot: registered first (its frames may come at once),
        then its engine state restored on `engine` with its schedule moved to now; on failure it is closed."""
        sid = session.id
        self.sessions[sid] = session
        session.inputs.attach(_Link(self, sid))
        session.recorder = lambda: self.start_recording(sid)
        try:
            await engine.import_session(sid, session.inputs.engine_state(), seed=session.seed,
                                        blob=session_state.rebase(snapshot.state, self.clock()))
        except (StatePoolExhausted, EngineUnavailable, SessionStateError) as e:
            self.close(sid, CloseReason.ERROR, detail=f"restoring snapshot {snapshot.snapshot_id} failed: {e}")
            if isinstance(e, StatePoolExhausted):
                raise CapacityExhausted(str(e), retry_after_s=self.next_release_in_s()) from e
            raise SnapshotRefused(f"snapshot {snapshot.snapshot_id} could not be restored: {e}") from e
        session.inputs.resend()  # the server's epoch, wants and conditioning, whole
        # (the keys and axes held at the snapshot stay held: the world goes on as it was, until a client connects
        # and starts its own inputs afresh)
        logger.info("Session(%s): started from snapshot %s on engine %d", sid, snapshot.snapshot_id, engine.id)
        return session

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        """Keep the session's world as a snapshot, captured at its next chunk boundary (it generates on).

        Returns:
            the snapshot's meta (`snapshot_id`, `state_bytes`, `created_at`, ...).

        Raises:
            SessionNotFound: no such open session.
            SnapshotRefused: no snapshots here, a directing session, between engines, the engine could not
                capture it, or the store is full.
        """
        s = self.get(session_id)
        if self.snapshots is None:
            raise SnapshotRefused("this server keeps no snapshots (start it with --snapshots-dir)")
        if s.mode != "interactive":
            raise SnapshotRefused("snapshots of directing sessions are not supported yet")
        digest = await self.weights_sha256()
        engine = self.engine_of(session_id)
        if engine is None:
            raise SnapshotRefused(f"session {session_id} is between engines; try again in a moment")
        try:
            blob = await engine.capture_session(session_id)
        except (EngineUnavailable, KeyError) as e:
            raise SnapshotRefused(f"session {session_id} could not be captured: {e}") from None
        next_frame = self.model.spec.pixel_start(session_state.parse(blob).header["next_latent"])
        return self.snapshots.save(s, blob, weights_sha256=digest, next_frame=next_frame)

    # -- recordings ------------------------------------------------------------------------------------------

    async def weights_sha256(self) -> str:
        """sha256 of the served weights (`recording.weights_digest`; computed once, off the event loop): what
        recordings and snapshots are checked against."""
        if self._weights_sha256 is None:
            self._weights_sha256 = await asyncio.get_running_loop().run_in_executor(None, weights_digest, self.model)
        return self._weights_sha256

    async def _ready_to_record(self) -> None:
        """Refuse at once where nothing can be recorded; compute the weights' digest (once, off the loop)."""
        if self.recordings is None:
            raise RecordingRefused("this server does not record sessions (start it with --recordings-dir)")
        await self.weights_sha256()

    def _record(self, session: Session, engine: EngineHandle, *, from_start: bool,
                snapshot: Snapshot | None = None) -> EventLog:
        assert self.recordings is not None and self._weights_sha256 is not None
        snap = engine.snapshot
        report = snap.warmup
        choice = engine.thread_choice
        served = None if report is None else {"dtype": report.precision.dtype,
                                              "compiled_buckets": list(report.compiled_buckets),
                                              "package_buckets": list(report.package_buckets)}
        # the weights as the session's engine serves them (an engine process holds its own copy, in its served
        # dtype); as loaded here where no warm-up chose a dtype
        digest = snap.weights_sha256 or self._weights_sha256
        log = self.recordings.start(session, served=served, device=machine_kind(torch.device(engine.device)),
                                    threads=None if choice is None else choice.threads,
                                    from_start=from_start, weights_sha256=digest,
                                    snapshot=None if snapshot is None else snapshot.snapshot_id,
                                    snapshot_state=None if snapshot is None else snapshot.state)
        try:
            session.start_recording(log)
        except BaseException:  # closed meanwhile: the log must not stay open
            log.close("the session closed before its recording began")
            raise
        return log

    def _unrecord(self, session: Session) -> None:
        if session.stop_recording("the session could not start") is not None and self.recordings is not None:
            self.recordings.discard(session.id)

    async def start_recording(self, session_id: str) -> EventLog:
        """Record an open session from now (`record_start`): its log is not replayable (it did not begin with the
        session: `from_start` false).

        Raises:
            SessionNotFound: no such open session.
            RecordingRefused: no recordings here, the quota is full, or it is recording already.
        """
        s = self.get(session_id)
        await self._ready_to_record()
        if s.recording is not None:
            raise RecordingRefused(f"session {session_id} is already recording")
        engine = self.engine_of(session_id)
        if engine is None:
            raise RecordingRefused(f"session {session_id} is between engines; try again in a moment")
        return self._record(s, engine, from_start=False)

    def stop_recording(self, session_id: str) -> bool:
        """Stop a session's recording (`record_stop`); False if it was not recording.

        Raises:
            SessionNotFound: no such open session.
        """
        return self.get(session_id).stop_recording("asked") is not None

    def measured_loads(self, engine: EngineHandle | None = None) -> list[SessionLoad]:
        """Measured duty cycle and observation time of each open session (of one engine, if given)."""
        now = self.clock()
        return [SessionLoad(duty_cycle=s.duty_cycle(), observed_s=s.duty.observed_s(now))
                for s in list(self.sessions.values()) if s.state != SessionState.CLOSED
                and (engine is None or engine.holds(s.id))]

    def placement(self, *, exclude: EngineHandle | None = None) -> Placement:
        """Where a new session would go now, and the admission decision behind it (`sessions/placement.py`)."""
        measured = self.measured_loads()
        loads: dict[int, list[SessionLoad]] = {e.id: [] for e in self.engines}
        now = self.clock()
        for s in list(self.sessions.values()):
            e = self.engine_of(s.id)
            if e is not None and s.state != SessionState.CLOSED:
                loads[e.id].append(SessionLoad(duty_cycle=s.duty_cycle(), observed_s=s.duty.observed_s(now)))
        return place(self.engines, config=self.config.admission, loads=loads, pending=self._creating,
                     prior_duty=self.duty_prior.value(measured),
                     open_sessions=len(measured) + sum(self._creating.values()), exclude=exclude)

    def admission_decision(self) -> AdmissionDecision:
        """Would a new session be admitted now? (See `engine/admission.py` and `sessions/placement.py`.)

        A refusal's retry hint is the time until the first session no viewer holds is released
        (`next_release_in_s`)."""
        d = self.placement().decision
        if not d.admitted:
            d = dataclasses.replace(d, retry_after_s=self.next_release_in_s())
        return d

    def release_at_s(self, s: Session) -> float | None:
        """When housekeeping will close `s` if nothing changes (clock time, s); None while a viewer holds it.

        - a connected viewer holds a session indefinitely;
        - one that never had a viewer is released `connect_grace_s` after its creation, or when its
          connecting viewers' own deadline passes (`Session.connect_deadline_s`), whichever is later;
        - one whose viewers left is released `timeout_s` (the reconnect grace) after the last of its
          viewer leaving, its last action or its last other activity, and not before a re-offer still
          connecting has had its time.
        """
        if s.viewer_count > 0:
            return None
        pending = s.connect_deadline_s
        if not s.had_viewer:
            t = s.created_s + self.config.connect_grace_s
        else:
            last = max(s.last_activity_s, s.inputs.actions.last_push_s or 0.0, s.last_viewer_s or 0.0)
            t = last + self.config.timeout_s
        return t if pending is None else max(t, pending)

    def next_release_in_s(self) -> float:
        """Seconds until the first session's release (`release_at_s`), at least 1: the truthful `Retry-After`
        of a refusal. When every session is held by a viewer no release is due; then the configured hint
        (`AdmissionConfig.retry_after_s`)."""
        now = self.clock()
        due = [t for t in (self.release_at_s(s) for s in list(self.sessions.values())) if t is not None]
        if not due:
            return self.config.admission.retry_after_s
        return max(1.0, min(due) - now + self.config.tick_s)

    def get(self, session_id: str) -> Session:
        """The open session with this id.

        Raises:
            SessionNotFound: unknown or closed.
        """
        s = self.sessions.get(session_id)
        if s is None or s.state == SessionState.CLOSED:
            raise SessionNotFound(f"no session {session_id!r}")
        return s

    def close(self, session_id: str, reason: CloseReason = CloseReason.CLIENT, *, detail: str | None = None) -> None:
        """Close a session and free its engine state (idempotent).

        Args:
            detail: what happened, logged with the close at INFO (every `CloseReason.ERROR` close gives one,
                so that no session ends in error without its reason in the log; issue 31).
        """
        s = self.sessions.pop(session_id, None)
        if s is None:
            return
        now = self.clock()
        self.duty_prior.record_departure(SessionLoad(duty_cycle=s.duty_cycle(), observed_s=s.duty.observed_s(now)))
        s.inputs.link = None  # nothing more to its engine but the removal
        s.close(reason)
        e = self.engine_of(session_id)
        if e is not None:
            e.remove_session(session_id)
        if detail is None and reason == CloseReason.ERROR:
            detail = "no reason given"
        logger.info("Session(%s): closed (%s%s)", session_id, reason.value, f": {detail}" if detail else "")
        if self.on_close is not None:
            self.on_close(s)

    # -- engine callbacks ------------------------------------------------------------------------------

    def _on_frames(self, frames: list[FrameOut]) -> None:  # an engine's thread
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch_frames, frames)

    def _on_error(self, engine: EngineHandle, session_id: str, reason: str) -> None:  # an engine's thread
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch_error, engine, session_id, reason)

    def _on_engine_lost(self, engine: EngineHandle, session_ids: list[str], reason: str) -> None:  # event loop
        """An engine died: each of its sessions is told (`engine_lost`) and closed; no other is touched."""
        logger.error("%r lost (%s): closing its %d session(s)", engine, reason, len(session_ids))
        if self.on_engine_lost is not None:
            self.on_engine_lost(engine)
        for sid in session_ids:
            s = self.sessions.get(sid)
            if s is not None:
                why = f"engine {engine.id} ({engine.device}) was lost: {reason}"
                s.fail(why, code="engine_lost")
                self.close(sid, CloseReason.ERROR, detail=why)

    def _on_engine_stalled(self, engine: EngineHandle, session_ids: list[str], reason: str) -> None:  # event loop
        """An engine stopped making progress: each of its sessions is told (`engine_stalled`) and stays on it
        (it may come back; past its kill bound it is lost and they are closed)."""
        for sid in session_ids:
            s = self.sessions.get(sid)
            if s is not None:
                s.fail(reason, code="engine_stalled")

    def _dispatch_frames(self, frames: list[FrameOut]) -> None:
        """Each frame into its session's frame pipeline (`sessions/frames.py`: pacing first)."""
        for f in frames:
            s = self.sessions.get(f.session_id)
            if s is not None:
                s.frames.submit(f)

    def _resync(self, session_id: str) -> None:  # event loop
        s = self.sessions.get(session_id)
        if s is not None:
            s.inputs.resend()

    def _frame_outcome(self, outcome: str, lateness_s: float) -> None:
        if self.on_frame is not None:
            self.on_frame(outcome, lateness_s)

    def _dispatch_error(self, engine: EngineHandle, session_id: str, reason: str) -> None:
        s = self.sessions.get(session_id)
        e = self.engine_of(session_id)
        if s is not None and (e is None or e is engine):  # (not an old engine of a session that moved on since)
            s.fail(reason)
            self.close(session_id, CloseReason.ERROR, detail=f"failed on engine {engine.id}: {reason}")

    # -- housekeeping --------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            self.tick(self.clock())

    def tick(self, now_s: float) -> None:
        """Idle quiet sessions; close those no viewer holds once their grace has passed (`release_at_s`); look for
        engines that died unnoticed."""
        for e in self.engines:
            e.check()
        for sid, s in list(self.sessions.items()):
            s.tick(now_s)
            release = self.release_at_s(s)
            if release is not None and now_s > release:
                self.close(sid, CloseReason.TIMEOUT)
        if self.recordings is not None:
            self.recordings.sweep()

    @property
    def engines_up(self) -> int:
        """Engines ready to serve (alive, not stalled)."""
        return sum(1 for e in self.engines if e.ready)

    @property
    def ready(self) -> bool:
        """Whether at least one engine is ready (alive and not stalled in a step)."""
        return self.engines_up > 0


class _Link:
    """One session's `EngineLink`: its changes to the engine it is placed on, or to the move's queue."""

    def __init__(self, manager: SessionManager, session_id: str) -> None:
        self.manager = manager
        self.session_id = session_id

    def push_input(self, delta: InputDelta) -> None:
        m, sid = self.manager, self.session_id
        pending = m.moving.get(sid)
        if pending is not None:
            pending.append(delta)
        elif (e := m.engine_of(sid)) is not None:
            e.push_input(sid, delta)

    def update(self, state: ConditionerState) -> None:
        m, sid = self.manager, self.session_id
        if sid not in m.moving and (e := m.engine_of(sid)) is not None:
            e.update_session(sid, state)

    @property
    def engine_id(self) -> int | None:
        e = self.manager.engine_of(self.session_id)
        return None if e is None else e.id
