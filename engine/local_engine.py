"""LocalEngine: an engine core on a thread of the server's own process (no isolation, no IPC).

The core (`EngineCore`, `engine/core.py`) and its `DeviceWorker` run here; a
command of the engine contract (`engine/messages.py`) is applied in place
(`_send` calls `EngineCore.handle` on the event loop), events come back on
the worker thread, and the step runner hands frames straight to the owner's
`on_frames` (the worker thread). Used by default for one engine on an
accelerator (on a CPU the `worldcast` CLI runs the engine in a process of its
own unless `--no-engine-process`: `transport/cli.py`, `engine_processes`;
docs/operations.md, "Engines and engine processes") and whenever the server
was handed a model object instead of a name (tests). A dead worker thread is
reported as a lost engine by `check` (the owner's housekeeping calls it); it
is not restarted. A worker stuck in a step is marked `stalled` by the
heartbeat watchdog (`EngineHandle.watch`); a thread cannot be killed, so
past `stall_kill_after_s` it is reported lost (its sessions closed) and
stays lost.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from worldcast.engine import messages as msg
from worldcast.engine.core import EngineCore
from worldcast.engine.device_worker import DeviceWorker, EngineConfig, EngineSnapshot
from worldcast.engine.engine_handle import EngineHandle
from worldcast.engine.errors import EngineUnavailable, StatePoolExhausted
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.tuning.threads import ThreadChoice
from worldcast.models.base import WorldModel


class LocalEngine(EngineHandle):
    """A `DeviceWorker` thread and its `EngineCore` behind the `EngineHandle` interface.

    Args:
        engine_id: its id on this server.
        model: the model, on its device.
        config: the worker's settings.
        clock: monotonic clock, s (injectable for tests).
    """

    process = False
    warmup_shares_interpreter = True

    def __init__(self, engine_id: int, model: WorldModel, config: EngineConfig, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._on_step: Callable[[StepSchedulerOutput, StepRunnerOutput], None] | None = None
        self.worker = DeviceWorker(model, config, on_frames=lambda frames: None, on_error=lambda sid, why: None,
                                   clock=clock)
        super().__init__(engine_id, device=str(model.device), spec=model.spec, config=config)
        self.core = EngineCore(self.worker, self._event)

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

    def _send(self, cmd: msg.Command) -> None:
        self.core.handle(cmd)

    def _check_room(self) -> None:
        if self.state not in ("ready", "starting"):
            raise EngineUnavailable(f"engine {self.id} is {self.state}")
        if self.worker.free_slots < 1:
            raise StatePoolExhausted(f"all {self.num_slots} state slots in use "
                                     f"({self.worker.pool.slot_bytes} B of declared state per session)")

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

    def dead_reason(self) -> str | None:
        if self.worker.alive:
            return None
        return self.worker.last_error or "device worker stopped"

    @property
    def progress_at_s(self) -> float | None:
        return self.worker.beat_at_s

    def _kill_stalled(self, reason: str) -> None:
        """A thread cannot be killed: the engine is reported lost (its sessions closed) and stays so."""
        self._lose(f"device worker {reason}")

    def _lose(self, reason: str) -> None:
        sids = self._forget_all()
        self._fail_waiting(f"engine {self.id} was lost: {reason}")
        self.losses += 1
        self.last_error = reason
        self._set_state("lost")
        self.on_lost(self, sids, self.last_error)

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
