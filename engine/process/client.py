"""EngineClient: the server's handle of one engine process, with crash detection and restart.

Each engine process (`engine/process/main.py`) is started with
multiprocessing's spawn method, one duplex pipe and a frame ring in shared
memory the server creates (`engine/process/shm_frames.py`). A reader thread per
process waits on the pipe and the process sentinel together
(`multiprocessing.connection.wait`): frames are copied out of the ring and
handed to `on_frames` at once; the pipe's EOF or the sentinel is the
process's death, noticed the moment the kernel closes its end, whatever
killed it (SIGKILL, a segfault, the OOM killer, an exit).

A hang is seen by the heartbeat: the process's status (every
`EngineLaunch.status_interval_s`) carries the time its device loop last came
round (`DeviceWorker.beat_at_s`); the watchdog (`EngineHandle.watch`) marks
the engine `stalled` when it is older than `EngineConfig.stall_after_s`
(a stopped process sends nothing, so its last beat ages the same way), fails
the exports waiting on it at once (a drain answers instead of hanging), and
past `stall_kill_after_s` kills the process with SIGKILL: the reader thread
then sees the death as above.

On a death the handle goes `lost`, names the sessions it held to
`on_lost`, and restarts the process after a backoff (doubling from
`RestartPolicy.initial_backoff_s` to `max_backoff_s`, back to the start
once an incarnation has stayed up `stable_s`): `restarting`, then `ready`.
A restarted process starts from its predecessor's measured step costs and
thread count, so it skips the warm-up timing and is back in the time it
takes to import and load the model.

Threads: the event loop calls the session methods (`add_session`, ...);
the reader thread calls `on_frames`, `on_error`, `on_step`; state changes,
`on_lost` and `on_state` run on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from worldcast.engine import messages as cmsg
from worldcast.engine.cost_model import CostModel
from worldcast.engine.device_worker import EngineSnapshot
from worldcast.engine.engine_handle import EngineHandle
from worldcast.engine.errors import EngineUnavailable
from worldcast.engine.process import messages as msg
from worldcast.engine.process.launch import STOP_TIMEOUT_S, EngineLaunch, Incarnation, RestartPolicy, exit_reason, spawn
from worldcast.engine.process.shm_frames import FrameMeta, ShmFrameRing
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.tuning.threads import ThreadChoice
from worldcast.engine.tuning.warmup import WarmupReport
from worldcast.models.spec import WorldModelSpec

__all__ = ["EngineClient", "EngineLaunch", "RestartPolicy"]

logger = logging.getLogger(__name__)

#: The image of a frame whose pixels an engine process dropped on a full ring (`FrameOut.lost`).
_NO_PIXELS = np.zeros((0, 0, 3), np.uint8)


def frames_from(metas: list[FrameMeta], ring: ShmFrameRing) -> list[FrameOut]:
    """The frames of one `FramesReady`, their pixels copied out of `ring` (and their slots released); a frame the
    engine dropped on a full ring (`ring_index` -1) comes without pixels (`FrameOut.lost`), keeping its place and
    its chunk record."""
    return [FrameOut(f.session_id, f.frame_index, ring.read(f) if f.ring_index >= 0 else _NO_PIXELS,
                     f.present_at_s, f.action_seq, f.epoch, f.timings_ms, f.chunk, lost=f.ring_index < 0)
            for f in metas]


class EngineClient(EngineHandle):
    """An engine core in its own process (see the module docstring).

    Args:
        engine_id: its id on this server.
        launch: how to start its process.
        spec: the served model's spec (frame size, chunk geometry).
        restart: when to restart it after a loss.
    """

    process = True

    def __init__(self, engine_id: int, launch: EngineLaunch, *, spec: WorldModelSpec,
                 restart: RestartPolicy | None = None) -> None:
        super().__init__(engine_id, device=launch.device, spec=spec, config=launch.config)
        self.launch = launch
        self.restart_policy = restart or RestartPolicy()
        self._inc: Incarnation | None = None
        self._numbers = itertools.count(1)
        self._snapshot = EngineSnapshot(0, 0, 0)
        self._stalled_s = 0.0
        self._beat_at_s: float | None = None  #: the device loop's last heartbeat (CLOCK_MONOTONIC s), this incarnation
        self._thread_choice: ThreadChoice | None = None
        self.frozen_objects = 0  #: start-up objects the engine process froze out of garbage collection
        #: what a restart takes from the lost process: its step costs, thread count and warm-up report
        self._prior: tuple[CostModel, int | None, WarmupReport | None] | None = None
        self._warmup = True
        self._backoff_s = self.restart_policy.initial_backoff_s
        self._restart_task: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, *, warmup: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._warmup = warmup
        await self._boot()
        self._start_watchdog()

    async def _boot(self) -> None:
        """Start a process and wait for it to be ready.

        Raises:
            EngineUnavailable: it exited or did not get ready in time.
        """
        loop = asyncio.get_running_loop()
        prior = self._prior
        inc = await loop.run_in_executor(None, lambda: spawn(self.id, self.launch, spec=self.spec,
                                                             number=next(self._numbers), warmup=self._warmup,
                                                             prior=prior))
        inc.ready = loop.create_future()
        self._inc = inc
        self._beat_at_s = None
        inc.reader = threading.Thread(target=self._read_loop, args=(inc,), name=f"worldcast-engine-{self.id}-reader",
                                      daemon=True)
        inc.reader.start()
        try:
            await asyncio.wait_for(asyncio.shield(inc.ready), self.restart_policy.start_timeout_s)
        except TimeoutError:
            self.last_error = f"not ready within {self.restart_policy.start_timeout_s:.0f} s"
            await loop.run_in_executor(None, self._kill, inc)
            raise EngineUnavailable(f"engine {self.id}: {self.last_error}") from None
        logger.info("Engine(%d): ready on %s, pid %s (incarnation %d)", self.id, self.device, inc.pid, inc.number)
        self._set_state("ready")

    def _kill(self, inc: Incarnation) -> None:
        if inc.proc.is_alive():
            inc.proc.kill()
        inc.proc.join(STOP_TIMEOUT_S)

    async def aclose(self) -> None:
        self._closing = True
        await self._stop_watchdog()
        if self._restart_task is not None:
            self._restart_task.cancel()
            try:
                await self._restart_task
            except BaseException:  # noqa: BLE001 - cancelled
                pass
        inc, self._inc = self._inc, None
        if inc is not None:
            self._send_to(inc, msg.Shutdown())
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._stop_process, inc)
        self._set_state("stopped")

    def _stop_process(self, inc: Incarnation) -> None:
        inc.proc.join(STOP_TIMEOUT_S)
        if inc.proc.is_alive():
            logger.warning("Engine(%d): pid %s did not stop in %.0f s; killing it", self.id, inc.pid, STOP_TIMEOUT_S)
            self._kill(inc)
        if inc.reader is not None:
            inc.reader.join(STOP_TIMEOUT_S)  # it saw the EOF and closed the ring and the pipe
        inc.ring.close()  # (idempotent) a reader that never started

    # -- the reader thread ---------------------------------------------------------------------------

    def _read_loop(self, inc: Incarnation) -> None:
        while True:
            try:
                ready = wait([inc.conn, inc.proc.sentinel])
            except OSError:
                break
            if inc.conn in ready:
                try:
                    m = inc.conn.recv()
                except (EOFError, OSError):
                    break
                self._handle(inc, m)
                continue
            try:  # the process exited: what it sent before is still in the pipe
                while inc.conn.poll():
                    self._handle(inc, inc.conn.recv())
            except (EOFError, OSError):
                pass
            break
        inc.proc.join(1.0)  # it closed its pipe: its exit code follows at once
        reason = exit_reason(inc)
        inc.ring.close()  # nothing reads it after this thread
        with inc.send_lock:  # no send is mid-write on the fd we close
            try:
                inc.conn.close()
            except OSError:
                pass
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._ended, inc, reason)

    def _handle(self, inc: Incarnation, m: object) -> None:
        if isinstance(m, msg.FramesReady):
            frames = frames_from(m.frames, inc.ring)
            ipc_ms = (time.monotonic() - m.sent_s) * 1e3  # pipe + copy out of the ring, this batch of frames
            for f in frames:
                f.timings_ms["ipc"] = ipc_ms
            self.on_frames(frames)
        elif isinstance(m, msg.EngineStatus):
            self._snapshot, self._stalled_s, inc.frames_dropped = m.snapshot, m.stalled_s, m.frames_dropped
            if m.beat_at_s is not None:
                self._beat_at_s = m.beat_at_s
            hook = self.on_step
            if hook is not None:
                for rec in m.steps:
                    hook(StepSchedulerOutput(kind=rec.kind, session_ids=rec.session_ids, begin_chunk_ids=[],
                                             deadlines_s={}, next_wake_s=None),
                         StepRunnerOutput(step_time_s=rec.step_time_s, frames=[],
                                          failed={sid: "step failed" for sid in rec.failed}))
        elif isinstance(m, (cmsg.SessionFailed, cmsg.SessionExported, cmsg.SessionRestored)):
            self._event(m)
        elif isinstance(m, msg.EngineHello):
            inc.pid, inc.num_slots, inc.slot_bytes = m.pid, m.num_slots, m.slot_bytes
            self._snapshot = EngineSnapshot(m.num_slots, 0, m.slot_bytes)
        elif isinstance(m, msg.EngineReady):
            self._thread_choice, self._snapshot = m.thread_choice, m.snapshot
            self.frozen_objects = m.frozen_objects
            # warm-up may have allocated the pool anew in the served dtype (`DeviceWorker._replan_pool`)
            inc.num_slots, inc.slot_bytes = m.snapshot.slots_total, m.snapshot.slot_bytes
            inc.ready_at_s = time.monotonic()
            if inc.ready is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(lambda: inc.ready.done() or inc.ready.set_result(None))  # type: ignore[union-attr]
        elif isinstance(m, msg.EngineFatal):
            inc.fatal = m.reason

    # -- death and restart (event loop) ----------------------------------------------------------------

    def _ended(self, inc: Incarnation, reason: str) -> None:
        if inc.ready is not None and not inc.ready.done():
            inc.ready.set_exception(EngineUnavailable(f"engine {self.id}: {reason}"))
        if self._closing:
            return  # `aclose` is stopping it
        if inc is not self._inc:
            return  # an old incarnation finishing late
        self._inc = None
        sids = self._forget_all()
        self._fail_waiting(f"engine {self.id} was lost: {reason}")
        was_ready = self.state in ("ready", "stalled")
        self.last_error = reason
        if was_ready:
            self.losses += 1
            logger.error("Engine(%d): lost (%s); %d session(s) on it", self.id, reason, len(sids))
            if inc.ready_at_s is not None and time.monotonic() - inc.ready_at_s >= self.restart_policy.stable_s:
                self._backoff_s = self.restart_policy.initial_backoff_s
            if self._snapshot.cost.snapshot():
                choice = self._thread_choice
                self._prior = (self._snapshot.cost, choice.threads if choice is not None else None,
                               self._snapshot.warmup)
        self._set_state("lost")
        if was_ready:
            self.on_lost(self, sids, reason)
            self._restart_task = asyncio.get_running_loop().create_task(self._restart(),
                                                                       name=f"engine-{self.id}-restart")

    async def _restart(self) -> None:
        """Start the process again after a backoff, until it is ready or the server stops."""
        while not self._closing:
            delay = self._backoff_s
            self._backoff_s = min(self.restart_policy.max_backoff_s, self._backoff_s * 2)
            logger.info("Engine(%d): restarting in %.1f s", self.id, delay)
            await asyncio.sleep(delay)
            self._set_state("restarting")
            self.restarts += 1
            try:
                await self._boot()
                return
            except EngineUnavailable as e:
                logger.error("Engine(%d): restart failed: %s", self.id, e)
                self.last_error = str(e)
                self._set_state("lost")
            except Exception as e:  # noqa: BLE001 - a failed spawn: try again later
                logger.exception("Engine(%d): restart failed", self.id)
                self.last_error = f"{type(e).__name__}: {e}"
                self._set_state("lost")

    # -- liveness (event loop) ------------------------------------------------------------------------

    @property
    def progress_at_s(self) -> float | None:
        return self._beat_at_s

    def _kill_stalled(self, reason: str) -> None:
        inc = self._inc
        if inc is None or not inc.proc.is_alive():
            return
        inc.fatal = reason
        inc.proc.kill()  # SIGKILL works on a stopped process too; the reader thread sees the death

    # -- sessions (event loop) ----------------------------------------------------------------------

    def _send_to(self, inc: Incarnation | None, m: object) -> None:
        if inc is None:
            return
        try:
            with inc.send_lock:
                inc.conn.send(m)
        except (OSError, ValueError):  # it is dying: the reader thread reports the loss
            pass

    def _send(self, cmd: cmsg.Command) -> None:
        self._send_to(self._inc, cmd)

    async def _send_bulk(self, cmd: cmsg.Command) -> None:
        """A moved session's bytes are pickled and written off the event loop."""
        inc = self._inc
        await asyncio.get_running_loop().run_in_executor(None, self._send_to, inc, cmd)

    def _check_room(self) -> None:
        if self._inc is None:
            raise EngineUnavailable(f"engine {self.id} is {self.state}")
        super()._check_room()

    # -- load ----------------------------------------------------------------------------------------

    @property
    def num_slots(self) -> int:
        inc = self._inc
        return inc.num_slots if inc is not None else 0

    @property
    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    @property
    def thread_choice(self) -> ThreadChoice | None:
        return self._thread_choice

    @property
    def stalled_s(self) -> float:
        return self._stalled_s

    @property
    def pid(self) -> int | None:
        inc = self._inc
        return inc.pid if inc is not None else None

    @property
    def frames_dropped(self) -> int:
        """Frames its process dropped on a full ring (this incarnation)."""
        inc = self._inc
        return inc.frames_dropped if inc is not None else 0

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["load"]["frames_dropped"] = self.frames_dropped
        return out
