"""LocalEngine: an engine core on a thread of the server's own process (no isolation, no IPC).

The `DeviceWorker` runs here and reads each session's conditioner (the
server's `SessionInputs`) directly; a pushed action wakes it straight from
the inputs (`SessionInputs.on_input` -> `DeviceWorker.wake`, registered in
`add_session`), and its step runner hands frames straight to the owner's
`on_frames` (the worker thread), so neither direction passes through this
module per action. Used by default for one engine on an accelerator (on a CPU the `worldcast` CLI
runs the engine in a process of its own unless `--no-engine-process`: `transport/cli.py`,
`engine_processes`; docs/operations.md, "Engines and engine processes") and whenever the server was
handed a model object instead of a name (tests). A dead worker thread is reported as a lost engine by `check`
(the owner's housekeeping calls it); it is not restarted. A worker stuck in a
step is marked `stalled` by the heartbeat watchdog (`EngineHandle.watch`);
a thread cannot be killed, so past `stall_kill_after_s` it is reported lost
(its sessions closed) and stays lost.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

from worldcast.engine.device_worker import DeviceWorker, EngineConfig, EngineSnapshot
from worldcast.engine.engine_handle import EngineHandle, SessionSource
from worldcast.engine.errors import EngineUnavailable
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.tuning.threads import ThreadChoice
from worldcast.models.base import WorldModel


class LocalEngine(EngineHandle):
    """A `DeviceWorker` thread behind the `EngineHandle` interface.

    Args:
        engine_id: its id on this server.
        model: the model, on its device.
        config: the worker's settings.
        clock: monotonic clock, s (injectable for tests).
    """

    process = False

    def __init__(self, engine_id: int, model: WorldModel, config: EngineConfig, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._on_step: Callable[[StepSchedulerOutput, StepRunnerOutput], None] | None = None
        self.worker = DeviceWorker(model, config, on_frames=lambda frames: None, on_error=self._error, clock=clock)
        super().__init__(engine_id, device=str(model.device), spec=model.spec, config=config)
        self._sessions: set[str] = set()
        #: per session: removes its inputs' wake listener (`SessionSource.on_input`)
        self._unwake: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property  # type: ignore[override]
    def on_step(self) -> Callable[[StepSchedulerOutput, StepRunnerOutput], None] | None:
        return self._on_step

    @on_step.setter
    def on_step(self, hook: Callable[[StepSchedulerOutput, StepRunnerOutput], None] | None) -> None:
        self._on_step = hook
        self.worker.on_step = hook

    @property  # type: ignore[override]
    def on_frames(self) -> Callable[[list[FrameOut]], None]:
        return self.worker.on_frames

    @on_frames.setter
    def on_frames(self, hook: Callable[[list[FrameOut]], None]) -> None:
        self.worker.on_frames = hook  # the worker's runner calls it directly (no hop through this handle)

    # -- worker callbacks (worker thread) ---------------------------------------------------------

    def _error(self, session_id: str, reason: str) -> None:
        self._forget(session_id)
        self.on_error(session_id, reason)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, *, warmup: bool) -> None:
        self._loop = asyncio.get_running_loop()
        if warmup:
            await self._loop.run_in_executor(None, self.worker.warmup)
        self.worker.start()
        self._set_state("ready")
        self._start_watchdog()

    async def aclose(self) -> None:
        await self._stop_watchdog()
        await asyncio.get_running_loop().run_in_executor(None, self.worker.stop)
        self._set_state("stopped")

    def check(self) -> None:
        """Report a worker thread that died as a lost engine (its sessions are named to `on_lost`)."""
        if self.state in ("ready", "stalled") and not self.worker.alive:
            self._lose(self.worker.last_error or "device worker stopped")

    @property
    def progress_at_s(self) -> float | None:
        return self.worker.beat_at_s

    def _kill_stalled(self, reason: str) -> None:
        """A thread cannot be killed: the engine is reported lost (its sessions closed) and stays so."""
        self._lose(f"device worker {reason}")

    def _lose(self, reason: str) -> None:
        with self._lock:
            sids, self._sessions = sorted(self._sessions), set()
            unwake, self._unwake = list(self._unwake.values()), {}
        for remove in unwake:
            remove()
        self.losses += 1
        self.last_error = reason
        self._set_state("lost")
        self.on_lost(self, sids, self.last_error)

    # -- sessions ----------------------------------------------------------------------------------

    @property
    def session_ids(self) -> set[str]:
        with self._lock:
            return set(self._sessions)

    def add_session(self, session_id: str, source: SessionSource, *, seed: int) -> None:
        if self.state != "ready" and self.state != "starting":
            raise EngineUnavailable(f"engine {self.id} is {self.state}")
        self.worker.add_session(session_id, source, seed=seed)
        self._track(session_id, source)

    def _track(self, session_id: str, source: SessionSource) -> None:
        """Count the session as placed here and let its pushes wake the worker directly."""
        remove = source.on_input(self.worker.wake)
        with self._lock:
            self._sessions.add(session_id)
            old = self._unwake.pop(session_id, None)
            self._unwake[session_id] = remove
        if old is not None:
            old()

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.discard(session_id)
            remove = self._unwake.pop(session_id, None)
        if remove is not None:
            remove()

    def remove_session(self, session_id: str) -> None:
        self._forget(session_id)
        self.worker.remove_session(session_id)

    def session_changed(self, session_id: str, source: SessionSource) -> None:
        self.worker.wake()

    def _future(self) -> tuple[asyncio.Future[object], Callable[[object, str | None], None]]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()

        def settle(value: object, error: str | None) -> None:
            def set_() -> None:
                if fut.done():
                    return
                if error is not None:
                    fut.set_exception(KeyError(error))
                else:
                    fut.set_result(value)
            if not loop.is_closed():
                loop.call_soon_threadsafe(set_)
        return fut, settle

    async def export_session(self, session_id: str) -> bytes:
        fut, settle = self._future()
        self.worker.export_session(session_id, lambda state, error: settle(state, error))
        blob = await fut
        self._forget(session_id)
        assert isinstance(blob, bytes)
        return blob

    async def import_session(self, session_id: str, source: SessionSource, *, seed: int, state: bytes,
                             verify: bool = False) -> bytes | None:
        fut, settle = self._future()
        self.worker.add_session(session_id, source, seed=seed, state=state, on_restored=settle, verify=verify)
        self._track(session_id, source)
        try:
            blob = await fut  # the restore's outcome: a move is done only once the target has the session
        except KeyError as e:
            self._forget(session_id)
            raise EngineUnavailable(f"engine {self.id}: {e.args[0] if e.args else e}") from None
        if not verify:
            return None
        assert isinstance(blob, bytes)
        return blob

    # -- load --------------------------------------------------------------------------------------

    @property
    def num_slots(self) -> int:
        return self.worker.pool.num_slots

    @property
    def free_slots(self) -> int:
        return self.worker.free_slots

    @property
    def snapshot(self) -> EngineSnapshot:
        return self.worker.snapshot

    @property
    def thread_choice(self) -> ThreadChoice | None:
        return self.worker.thread_choice

    @property
    def stalled_s(self) -> float:
        return self.worker.stalled_s

    @property
    def pid(self) -> int | None:
        return os.getpid()

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self.worker.alive and self.worker.stalled_s == 0.0

    def active_capacity(self, target_utilization: float) -> int:
        return self.worker.active_capacity(target_utilization)
