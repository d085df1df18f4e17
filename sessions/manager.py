"""SessionManager: create, look up, idle and close sessions; bridge engine frames to them.

The manager owns the device worker's session membership. Frames and errors
arrive on the worker thread and are marshalled to the event loop with
`call_soon_threadsafe`, where they reach each session's sinks.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from worldcast.engine.admission import AdmissionConfig, AdmissionDecision, DutyCyclePrior, SessionLoad, decide
from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.errors import KVPoolExhausted
from worldcast.engine.step_output import FrameOut
from worldcast.models.base import WorldModel
from worldcast.models.errors import ConditioningError
from worldcast.models.spec import Conditioning, ConditioningRequest
from worldcast.sessions.directing import DirectingSession
from worldcast.sessions.errors import CapacityExhausted, InvalidConditioning, SessionNotFound
from worldcast.sessions.session import CloseReason, Session, SessionMode, SessionState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionConfig:
    """Session lifecycle settings."""

    idle_after_s: float = 30.0  #: an ACTIVE session without actions goes IDLE after this, s
    timeout_s: float = 120.0  #: a session with no sink and no activity is closed after this, s
    tick_s: float = 1.0  #: housekeeping period, s
    #: frames are handed to sinks no earlier than this many frame periods before their presentation time;
    #: a chunk of many frames (causal Wan: 12) is thus paced out in real time instead of in a burst
    send_ahead_frames: float = 1.0
    warmup: bool = True  #: measure step costs at start (admission and pacing rely on them)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)  #: who gets in


class SessionManager:
    """All sessions of one server, and the device worker that runs them.

    Args:
        model: the world model.
        engine_config: device worker settings.
        config: session settings.
        clock: monotonic clock, s.
    """

    def __init__(
        self,
        model: WorldModel,
        *,
        engine_config: EngineConfig,
        config: SessionConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.config = config
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.worker = DeviceWorker(
            model, engine_config, on_frames=self._on_frames, on_error=self._on_error, clock=clock
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._creating = 0  #: sessions admitted but not yet registered (their prompt is being encoded)
        #: duty cycle charged to sessions not yet measured: the mean over measured ones
        adm = config.admission
        self.duty_prior = DutyCyclePrior(adm.min_observation_s, default=adm.default_duty_cycle)
        self._tick_task: asyncio.Task[None] | None = None
        #: hooks for metrics: on_frame(delivered, lateness_s), on_admission(admitted)
        self.on_frame: Callable[[bool, float], None] | None = None
        self.on_admission: Callable[[bool], None] | None = None

    async def start(self) -> None:
        """Start the device worker and the housekeeping task."""
        self._loop = asyncio.get_running_loop()
        if self.config.warmup:
            await self._loop.run_in_executor(None, self.worker.warmup)
            # load the conditioning encoders now, not on the first user's request
            try:
                self.model.spec.conditioning.validate(ConditioningRequest())
            except ConditioningError:
                pass  # the model needs an image, and has no default one: nothing to warm up without one
            else:
                await self._loop.run_in_executor(None, self.model.encode_conditioning, ConditioningRequest())
        self.worker.start()
        self._tick_task = asyncio.create_task(self._tick_loop(), name="session-manager-tick")

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the manager runs on (None before `start`)."""
        return self._loop

    async def aclose(self) -> None:
        """Close every session and stop the worker (idempotent)."""
        if self._tick_task is not None:
            self._tick_task.cancel()
            try:
                await self._tick_task
            except asyncio.CancelledError:
                pass
            self._tick_task = None
        for sid in list(self.sessions):
            self.close(sid, CloseReason.SHUTDOWN)
        await asyncio.get_running_loop().run_in_executor(None, self.worker.stop)

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
        stamp_frames: bool = False, mode: SessionMode = "interactive",
    ) -> Session:
        """Open a session; its initial frame is generated at once.

        Args:
            prompt: the text prompt (None: the model's default, for a model that takes text).
            image: uint8 (H, W, 3) RGB starting image, decoded (None: none; a model that needs one
                uses its declared default or refuses).
            stamp_frames: ask its video sinks to stamp frame index and action seq into the pixels.
            mode: "directing" sessions wait for their first direction (paused) and keep their
                segments in `Session.directing` (sessions/directing.py).

        Raises:
            InvalidConditioning: the prompt, image or mode is refused (checked before admission:
                nothing is allocated).
            CapacityExhausted: too many sessions or no KV slot (retry later).
        """
        request = ConditioningRequest(text=prompt or None, image=image)
        self.check_conditioning(request, mode=mode)
        decision = self.admission_decision()
        if self.on_admission is not None:
            self.on_admission(decision.admitted)
        if not decision.admitted:
            logger.info("SessionManager: refused a session: %s", decision.reason)
            raise CapacityExhausted(f"refused: {decision.reason}", retry_after_s=decision.retry_after_s)
        self._creating += 1  # counted by admission while we wait, so concurrent creates cannot overshoot
        try:
            context = await asyncio.get_running_loop().run_in_executor(None, self._encode, request)
        finally:
            self._creating -= 1
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
        )
        if mode == "directing":
            session.directing = DirectingSession(session)
            session.pause()  # nothing to generate until the first direction
        try:
            self.worker.add_session(sid, session, seed=session.seed)
        except KVPoolExhausted as e:
            raise CapacityExhausted(str(e)) from e
        self.sessions[sid] = session
        session.on("state", lambda s, st: self.worker.wake())
        session.on("control", lambda s, op: self.worker.wake())  # flush, cancel, resume act at the next step
        session.on("input", lambda s, seq: self.worker.wake())  # an idle device starts the next chunk at once
        logger.info("Session(%s): created (prompt of %d chars, %s, seed %d)", sid, len(prompt or ""),
                    "no image" if image is None else f"a {image.shape[1]}x{image.shape[0]} image", session.seed)
        return session

    def measured_loads(self) -> list[SessionLoad]:
        """Measured duty cycle and observation time of each open session."""
        now = self.clock()
        return [SessionLoad(duty_cycle=s.duty_cycle(), observed_s=s.duty.observed_s(now))
                for s in list(self.sessions.values()) if s.state != SessionState.CLOSED]

    def admission_decision(self) -> AdmissionDecision:
        """Would a new session be admitted now? (See `engine/admission.py`.)"""
        measured = self.measured_loads()
        prior = self.duty_prior.value(measured)
        adm = self.config.admission
        return decide(
            adm,
            admitted=measured + [SessionLoad(duty_cycle=prior, observed_s=0.0)] * self._creating,
            active_capacity=self.worker.active_capacity(adm.target_utilization),
            kv_free_slots=self.worker.free_slots,
            prior_duty=prior,
        )

    def get(self, session_id: str) -> Session:
        """The open session with this id.

        Raises:
            SessionNotFound: unknown or closed.
        """
        s = self.sessions.get(session_id)
        if s is None or s.state == SessionState.CLOSED:
            raise SessionNotFound(f"no session {session_id!r}")
        return s

    def close(self, session_id: str, reason: CloseReason = CloseReason.CLIENT) -> None:
        """Close a session and free its engine state (idempotent)."""
        s = self.sessions.pop(session_id, None)
        if s is None:
            return
        now = self.clock()
        self.duty_prior.record_departure(SessionLoad(duty_cycle=s.duty_cycle(), observed_s=s.duty.observed_s(now)))
        s.close(reason)
        self.worker.remove_session(session_id)
        logger.info("Session(%s): closed (%s)", session_id, reason.value)

    # -- engine callbacks (worker thread) -----------------------------------------------------------

    def _on_frames(self, frames: list[FrameOut]) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch_frames, frames)

    def _on_error(self, session_id: str, reason: str) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch_error, session_id, reason)

    def _dispatch_frames(self, frames: list[FrameOut]) -> None:
        """Deliver each frame now, or at `send_ahead_frames` periods before its presentation time if that is later.

        A chunk's frames come out of the engine together; pacing them here (one place,
        before every sink) keeps each sink a bounded drop-oldest queue of a frame or two.
        A frame held for later is still dropped at delivery if a flush made its epoch stale.
        """
        now = self.clock()
        ahead = self.config.send_ahead_frames * float(self.model.spec.frame_period)
        loop = self._loop
        for f in frames:
            due = f.present_at_s - ahead
            if due <= now or loop is None:
                self._deliver(f)
            else:
                loop.call_later(due - now, self._deliver, f)

    def _deliver(self, f: FrameOut) -> None:
        s = self.sessions.get(f.session_id)
        if s is not None:
            delivered = s.deliver(f) is not None
            if self.on_frame is not None:
                self.on_frame(delivered, self.clock() - f.present_at_s)

    def _dispatch_error(self, session_id: str, reason: str) -> None:
        s = self.sessions.get(session_id)
        if s is not None:
            s.fail(reason)
            self.close(session_id, CloseReason.ERROR)

    # -- housekeeping --------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            self.tick(self.clock())

    def tick(self, now_s: float) -> None:
        """Idle quiet sessions; close abandoned ones."""
        for sid, s in list(self.sessions.items()):
            s.tick(now_s)
            if s.sink_count == 0 and now_s - max(s.last_activity_s, s.actions.last_push_s or 0) > self.config.timeout_s:
                self.close(sid, CloseReason.TIMEOUT)

    @property
    def ready(self) -> bool:
        """Whether the device worker is alive and not stalled in a step."""
        return self.worker.alive and self.worker.stalled_s == 0.0
