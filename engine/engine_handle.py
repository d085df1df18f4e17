"""EngineHandle: what the server holds of one engine core, in its own thread or its own process.

One contract for both kinds, so sessions/ never asks which it has: the
handle sends the contract's commands (`engine/messages.py`) and the engine
core answers with its events (`engine/core.py` `EngineCore`, which owns each
session's inputs: `engine/conditioner.py`). The session methods below are
this class's, the same for both kinds; a kind supplies only how a command
gets to its core (`_send`) and how events come back (`_event`):
- `LocalEngine` (`engine/local_engine.py`): the core and its `DeviceWorker`
  on threads of the server's process; a command is applied in place, events
  and frames come back on the worker thread.
- `EngineClient` (`engine/process/client.py`): the core in an engine process of
  its own (`engine/process/main.py`); commands and events go over its pipe,
  frames through shared memory.

Callbacks (set by the owner before `start`; called from the engine's own
threads, so the owner marshals them to its event loop):
- `on_frames(frames)`: a list of `FrameOut`;
- `on_error(session_id, reason)`: one session placed here failed (the engine dropped it);
- `on_lost(engine, session_ids, reason)`: the engine died with these sessions;
- `on_stalled(engine, session_ids, reason)`: the engine stopped making progress with these sessions
  (event loop; they stay on it: it may come back, or be killed and lost);
- `on_step(plan, result)`: every executed step (metrics);
- `on_state(engine)`: its `state` changed.

States (`EngineState`): starting -> ready; ready -> lost when it dies;
lost -> restarting (after a backoff) -> ready; any -> stopped at shutdown;
ready -> stalled when its device loop makes no progress for
`EngineConfig.stall_after_s`; stalled -> ready when it comes round again,
stalled -> lost when it is still stuck after `EngineConfig.stall_kill_after_s`
(killed: an engine process is then restarted like a dead one).

Liveness: the device loop stamps `DeviceWorker.beat_at_s` each time it comes
round (after every step, and at least every `idle_poll_s` while idle, which
is its answer to "are you there" when there is no work); the handle's
watchdog task (`watch`, every `LIVENESS_CHECK_S`) compares it with the
clock. A side thread cannot fake progress: only the loop writes the beat.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from worldcast.engine import messages as msg
from worldcast.engine.admission import active_capacity
from worldcast.engine.conditioner import ConditionerState, InputDelta
from worldcast.engine.device_worker import EngineConfig, EngineSnapshot
from worldcast.engine.errors import EngineUnavailable, StatePoolExhausted
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.tuning.threads import ThreadChoice
from worldcast.models.spec import WorldModelSpec

logger = logging.getLogger(__name__)

#: An engine's life (see the module docstring).
EngineState = Literal["starting", "ready", "stalled", "lost", "restarting", "stopped"]

#: How often an engine's watchdog compares its heartbeat with the clock, s (a stall is seen this much late
#: at most, plus an engine process's status interval).
LIVENESS_CHECK_S = 0.1


class EngineHandle(abc.ABC):
    """One engine core as the server sees it (see the module docstring).

    Args:
        engine_id: its id on this server (0, 1, ...).
        device: its torch device.
        spec: the served model's spec (the same model on every engine).
        config: its device worker's settings.
    """

    process: bool = False  #: whether it runs in a process of its own (reported, never asked by sessions/)
    #: whether its warm-up runs on the server's interpreter (its timings would then count whatever else the
    #: server's threads do meanwhile, e.g. loading the conditioning encoders: `SessionManager.start`)
    warmup_shares_interpreter: bool = False

    def __init__(self, engine_id: int, *, device: str, spec: WorldModelSpec, config: EngineConfig) -> None:
        self.id = engine_id
        self.device = device
        self.spec = spec
        self.config = config
        self.state: EngineState = "starting"
        self.draining = False  #: placement skips it (`POST /v1/engines/{id}/drain`)
        self.restarts = 0  #: times it was restarted after a loss
        self.losses = 0  #: times it was lost
        self.last_error: str | None = None
        self.state_since_s = time.monotonic()
        self.on_frames: Callable[[list[FrameOut]], None] = lambda frames: None
        self.on_error: Callable[[str, str], None] = lambda sid, reason: None
        self.on_lost: Callable[[EngineHandle, list[str], str], None] = lambda engine, sids, reason: None
        self.on_step: Callable[[StepSchedulerOutput, StepRunnerOutput], None] | None = None
        self.on_state: Callable[[EngineHandle], None] = lambda engine: None
        self.on_stalled: Callable[[EngineHandle, list[str], str], None] = lambda engine, sids, reason: None
        #: a session's core lost what it was told for a while (a late capture put back in place): send it the
        #: session's epoch, wants and conditioning again (event loop)
        self.on_resync: Callable[[str], None] = lambda session_id: None
        self.stalls = 0  #: times it was marked stalled
        self._up_since_s = time.monotonic()  #: when it last became ready from a start (not from a stall)
        self._watchdog: asyncio.Task[None] | None = None
        self._killing = False  #: the watchdog asked for it to be killed (this stall)
        self._loop: asyncio.AbstractEventLoop | None = None  #: set by `start`
        self._lock = threading.Lock()
        self._sessions: set[str] = set()  #: sessions on it (what `session_ids` answers)
        self._versions: dict[str, int] = {}  #: context version last sent per session
        self._requests = itertools.count(1)
        self._exports: dict[int, asyncio.Future[bytes]] = {}
        self._captures: set[int] = set()  #: export requests that keep the session here (`capture_session`)
        self._restored: dict[str, asyncio.Future[bytes | None]] = {}

    def __repr__(self) -> str:
        return f"Engine({self.id}, {self.device}, {self.state})"

    def _set_state(self, state: EngineState) -> None:
        if state != self.state:
            if state == "ready" and self.state != "stalled":
                self._up_since_s = time.monotonic()
            if state != "stalled":
                self._killing = False
            self.state = state
            self.state_since_s = time.monotonic()
            self.on_state(self)

    # -- lifecycle ---------------------------------------------------------------------------

    @abc.abstractmethod
    async def start(self, *, warmup: bool) -> None:
        """Bring the engine up and wait until it is ready.

        Raises:
            EngineUnavailable: it could not start (the reason names why).
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop it and free what it holds (idempotent)."""

    def dead_reason(self) -> str | None:
        """Why its core is dead where that is known before `check` reports it lost (None: not known dead)."""
        return None

    def check(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Housekeeping (event loop, about once a second): report a death not noticed otherwise."""

    # -- liveness (event loop) ---------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def progress_at_s(self) -> float | None:
        """CLOCK_MONOTONIC s at which its device loop was last seen coming round (None: not known yet)."""

    def no_progress_s(self, now_s: float | None = None) -> float:
        """Seconds since its device loop last made progress (0 unless ready or stalled)."""
        if self.state not in ("ready", "stalled"):
            return 0.0
        now_s = time.monotonic() if now_s is None else now_s
        beat = self.progress_at_s
        last = self._up_since_s if beat is None else max(beat, self._up_since_s)
        return max(0.0, now_s - last)

    def watch(self, now_s: float) -> None:
        """Compare the heartbeat with the clock (event loop): mark it stalled (its sessions named to
        `on_stalled`), ready again when it comes round, or have it killed (`_kill_stalled`) past
        `EngineConfig.stall_kill_after_s`."""
        if self.state not in ("ready", "stalled"):
            return
        quiet = self.no_progress_s(now_s)
        c = self.config
        if self.state == "ready" and quiet >= c.stall_after_s:
            self.stalls += 1
            reason = (f"engine {self.id} ({self.device}) made no progress for {quiet:.1f} s; it is killed and "
                      f"restarted if still stuck after {c.stall_kill_after_s:.0f} s")
            sids = sorted(self.session_ids)
            logger.warning("Engine(%d): stalled: no progress for %.1f s; %d session(s) on it", self.id, quiet,
                           len(sids))
            self._set_state("stalled")
            self._stalled()
            self.on_stalled(self, sids, reason)
        elif self.state == "stalled" and quiet < c.stall_after_s:
            logger.warning("Engine(%d): making progress again; ready", self.id)
            self._set_state("ready")
        elif self.state == "stalled" and quiet >= c.stall_kill_after_s and not self._killing:
            self._killing = True
            reason = f"made no progress for {quiet:.1f} s (stalled); killed"
            logger.error("Engine(%d): %s", self.id, reason)
            self._kill_stalled(reason)

    def _stalled(self) -> None:
        """It was just marked stalled: exports waiting on it fail now (a drain or move answers; a late capture is
        put back here: `_settle_export`)."""
        self._fail_waiting(f"engine {self.id} is stalled: no progress for {self.no_progress_s():.1f} s",
                           exports_only=True)

    @abc.abstractmethod
    def _kill_stalled(self, reason: str) -> None:
        """End an engine stuck past `stall_kill_after_s`, so that it is handled as lost (event loop)."""

    def _start_watchdog(self) -> None:
        """Start the task that calls `watch` every `LIVENESS_CHECK_S` (idempotent; event loop)."""
        if self._watchdog is not None:
            return

        async def run() -> None:
            while True:
                await asyncio.sleep(LIVENESS_CHECK_S)
                try:
                    self.watch(time.monotonic())
                except Exception:  # noqa: BLE001 - the watchdog must outlive a bug in one check
                    logger.exception("Engine(%d): liveness check failed", self.id)

        self._watchdog = asyncio.get_running_loop().create_task(run(), name=f"engine-{self.id}-watchdog")

    async def _stop_watchdog(self) -> None:
        task, self._watchdog = self._watchdog, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    # -- sessions: the contract (event loop) -------------------------------------------------------

    @abc.abstractmethod
    def _send(self, cmd: msg.Command) -> None:
        """Get one command to the core (event loop; never raises: a core that is gone reports its loss)."""

    async def _send_bulk(self, cmd: msg.Command) -> None:
        """`_send` for a command carrying a moved session's bytes (a kind may send it off the event loop)."""
        self._send(cmd)

    def _check_room(self) -> None:
        """Raises EngineUnavailable (not ready) or StatePoolExhausted (no free slot) before a session is sent."""
        if self.state != "ready":
            raise EngineUnavailable(f"engine {self.id} is {self.state}")
        if self.free_slots < 1:
            raise StatePoolExhausted(f"engine {self.id}: all {self.num_slots} state slots in use")

    @property
    def session_ids(self) -> set[str]:
        """Sessions placed here (a copy)."""
        with self._lock:
            return set(self._sessions)

    def holds(self, session_id: str) -> bool:
        """Whether the session is placed here: the one record of where a session runs (`SessionManager.engine_of`
        asks each engine)."""
        with self._lock:
            return session_id in self._sessions

    def _track(self, session_id: str, context_version: int | None) -> None:
        with self._lock:
            self._sessions.add(session_id)
            if context_version is None:
                self._versions.pop(session_id, None)
            else:
                self._versions[session_id] = context_version

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.discard(session_id)
            self._versions.pop(session_id, None)

    def _forget_all(self) -> list[str]:
        """Drop every session (the engine is lost); returns their ids, sorted."""
        with self._lock:
            sids, self._sessions = sorted(self._sessions), set()
            self._versions.clear()
        return sids

    def add_session(self, session_id: str, state: ConditionerState, *, seed: int) -> None:
        """Start generating for a new session (`AddSession`), its inputs starting from `state` (context given).

        Raises:
            StatePoolExhausted: no free slot.
            EngineUnavailable: not ready.
        """
        self._check_room()
        self._track(session_id, state.context_version)
        self._send(msg.AddSession(session_id, seed, state))

    def update_session(self, session_id: str, state: ConditionerState) -> None:
        """The session's epoch, wants or conditioning changed (`UpdateSession`; the arrays are sent only when
        `context_version` differs from the last sent): the core acts on it at its next step boundary."""
        with self._lock:
            if session_id not in self._sessions:
                return
            if self._versions.get(session_id) == state.context_version:
                state = dataclasses.replace(state, context=None)
            self._versions[session_id] = state.context_version
        self._send(msg.UpdateSession(session_id, state))

    def push_input(self, session_id: str, delta: InputDelta) -> None:
        """One change of the session's inputs (`PushInput`); an action (not `clear`) also lets an idle device
        start the session's next chunk at once."""
        self._send(msg.PushInput(session_id, delta))

    def remove_session(self, session_id: str) -> None:
        """Stop generating for a session and free its slot (idempotent); a restore waiting for it fails (the
        core may drop an add removed before it started without a word)."""
        self._forget(session_id)
        self._send(msg.RemoveSession(session_id))
        fut = self._restored.pop(session_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(EngineUnavailable(f"session {session_id} was removed before its restore"))

    async def export_session(self, session_id: str) -> bytes:
        """Capture the session's whole state at its next chunk boundary and stop serving it here.

        Raises:
            EngineUnavailable: the engine is not ready, stalled or went away first.
            KeyError: no such session here.
        """
        if self.state != "ready":
            extra = f": no progress for {self.no_progress_s():.1f} s" if self.state == "stalled" else ""
            raise EngineUnavailable(f"engine {self.id} is {self.state}{extra}")
        rid = next(self._requests)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._exports[rid] = fut
        self._send(msg.ExportSession(rid, session_id))
        blob = await fut
        self._forget(session_id)
        return blob

    async def capture_session(self, session_id: str) -> bytes:
        """Capture the session's whole state at its next chunk boundary and keep serving it here (a snapshot:
        `sessions/snapshots.py`). The session generates on without a pause beyond the capture itself.

        Raises:
            EngineUnavailable: the engine is not ready, stalled or went away first.
            KeyError: no such session here.
        """
        if self.state != "ready":
            raise EngineUnavailable(f"engine {self.id} is {self.state}")
        rid = next(self._requests)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._exports[rid] = fut
        self._captures.add(rid)
        self._send(msg.ExportSession(rid, session_id, detach=False))
        try:
            return await fut
        finally:
            self._captures.discard(rid)

    async def import_session(self, session_id: str, state: ConditionerState, *, seed: int, blob: bytes,
                             verify: bool = False) -> bytes | None:
        """Serve a session moved here from another engine, from its state bytes (its inputs are the bytes'
        own; `state` is used where they carry none); returns once the core has restored it (or failed to).

        Returns:
            with `verify`, its state captured again right after the restore (else None).

        Raises:
            StatePoolExhausted: no free slot.
            EngineUnavailable: not ready, the engine went away, or the restore failed there (the session is
                then not on it).
        """
        self._check_room()
        # settled by the core's SessionRestored (or SessionFailed, or its loss): a move is done only once the
        # target has the session
        fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._restored[session_id] = fut
        self._track(session_id, None)  # the bytes' conditioning may be older: the next update sends it whole
        await self._send_bulk(msg.AddSession(session_id, seed, state, state=blob, verify=verify))
        restored = await fut
        return restored if verify else None

    def _event(self, ev: msg.Event) -> None:
        """One event from the core (any thread: the core's device thread, a process's reader thread)."""
        if isinstance(ev, msg.SessionFailed):
            if self.holds(ev.session_id):  # (not a session that has moved on, or was removed meanwhile)
                self._forget(ev.session_id)
                self.on_error(ev.session_id, ev.reason)
            self._on_loop(self._settle_restored, ev.session_id, None, ev.reason)
        elif isinstance(ev, msg.SessionExported):
            self._on_loop(self._settle_export, ev.request_id, ev.session_id, ev.state, ev.error)
        elif isinstance(ev, msg.SessionRestored):
            self._on_loop(self._settle_restored, ev.session_id, ev.state, ev.error)

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _settle_export(self, request_id: int, session_id: str, state: bytes | None, error: str | None) -> None:
        fut = self._exports.pop(request_id, None)
        kept = request_id in self._captures  # a snapshot's capture: the session never left
        self._captures.discard(request_id)
        if fut is None or fut.done():
            if state is not None and not kept and session_id in self.session_ids:
                # its caller gave up (the engine stalled) and the session stayed here: the core detached it when
                # it came back, so it takes its own state back in place
                logger.warning("Engine(%d): Session(%s) exported after its mover gave up; restoring it here",
                               self.id, session_id)
                self._send(msg.AddSession(session_id, 0, None, state=state))
            return
        if state is None:
            fut.set_exception(KeyError(error or "export failed"))
        else:
            fut.set_result(state)

    def _settle_restored(self, session_id: str, state: bytes | None, error: str | None) -> None:
        fut = self._restored.pop(session_id, None)
        if fut is None and session_id in self.session_ids:  # a late capture put back in place (`_settle_export`)
            if error is None:
                self.on_resync(session_id)  # the core dropped what it was told while the session was detached
            else:
                self._forget(session_id)
                self.on_error(session_id, f"could not take its state back after a failed move: {error}")
            return
        if fut is None or fut.done():
            return
        if error is not None:
            self._forget(session_id)
            fut.set_exception(EngineUnavailable(error))
        else:
            fut.set_result(state)

    def _fail_waiting(self, why: str, *, exports_only: bool = False) -> None:
        """Fail every export (and restore) waiting on the core (event loop)."""
        waiting = list(self._exports.values()) + ([] if exports_only else list(self._restored.values()))
        self._exports.clear()
        if not exports_only:
            self._restored.clear()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(EngineUnavailable(why))

    # -- load ------------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def num_slots(self) -> int:
        """State slots of its pool (0 until known)."""

    @property
    def free_slots(self) -> int:
        """Slots neither held nor promised."""
        return max(0, self.num_slots - len(self.session_ids))

    @property
    @abc.abstractmethod
    def snapshot(self) -> EngineSnapshot:
        """Its latest published snapshot."""

    @property
    @abc.abstractmethod
    def thread_choice(self) -> ThreadChoice | None: ...

    @property
    @abc.abstractmethod
    def stalled_s(self) -> float: ...

    @property
    @abc.abstractmethod
    def pid(self) -> int | None: ...

    @property
    def steps_run(self) -> int:
        return self.snapshot.steps_run

    def active_capacity(self, target_utilization: float) -> int:
        """Sessions it carries generating at once, by its own measured costs (`admission.active_capacity`)."""
        cost, spec = self.snapshot.cost, self.spec
        return active_capacity(lambda b: cost.chunk_time_s(b, denoising_steps=spec.denoising_steps),
                               chunk_period_s=float(spec.chunk_period),
                               target_utilization=target_utilization,
                               max_batch=min(self.config.max_batch, max(1, self.num_slots)))

    @property
    def degraded(self) -> bool:
        return self.active_capacity(self.config.target_utilization) == 0

    @property
    def ready(self) -> bool:
        """Serving and not stalled in a step."""
        return self.state == "ready" and self.stalled_s == 0.0

    def info(self) -> dict[str, Any]:
        """A JSON-able summary (`GET /v1/engines`)."""
        snap = self.snapshot
        choice = self.thread_choice
        return {
            "id": self.id, "device": self.device, "pid": self.pid, "state": self.state, "draining": self.draining,
            "process": self.process, "sessions": sorted(self.session_ids), "restarts": self.restarts,
            "losses": self.losses, "last_error": self.last_error,
            "state_for_s": round(time.monotonic() - self.state_since_s, 3),
            "load": {
                "slots_used": len(self.session_ids), "slots_total": self.num_slots, "slot_bytes": snap.slot_bytes,
                "active_capacity": self.active_capacity(self.config.target_utilization) if self.num_slots else 0,
                "queue_depth": snap.queue_depth, "steps_run": snap.steps_run,
                "threads": choice.threads if choice is not None else None,
                "degraded": bool(self.num_slots) and self.degraded, "stalled_s": round(self.stalled_s, 3),
                "no_progress_s": round(self.no_progress_s(), 3), "stalls": self.stalls,
            },
        }
