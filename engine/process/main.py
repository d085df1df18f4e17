"""The engine process: one device's model, state pool and `DeviceWorker`, apart from the server.

Started by the server (`engine/process/client.py`) with multiprocessing's
spawn method and one duplex pipe; `engine_main` is its whole life:

1. import the extra model families it was told of, build the model through
   the registry by name (`models/registry.py`: the server passes name,
   weights, device and options, never a model), attach the frame ring,
   build the `DeviceWorker`, say `EngineHello`;
2. warm up (a restarted engine takes its predecessor's measured costs and
   thread count instead), start the worker, say `EngineReady`;
3. serve: the main thread hands the server's commands to the engine core
   (`EngineCore.handle`, `engine/core.py`: the same contract and the same
   owner of each session's inputs as in the server's process), the worker thread
   writes frames into the ring and announces them (`FramesReady`), a status
   thread reports the snapshot and the device loop's heartbeat
   (`DeviceWorker.beat_at_s`, written by the loop alone) every
   `status_interval_s`.

It ends on `Shutdown`, on the pipe's EOF (the server is gone: nothing would
read its frames) and when its worker thread dies (`EngineFatal`, exit code
3: the server restarts it). A fault below Python (a segfault, the OOM killer,
SIGKILL) ends it without a word; the server notices the pipe's EOF and the
process sentinel at once.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from worldcast.engine import messages as cmsg
from worldcast.engine.core import EngineCore
from worldcast.engine.device_worker import DeviceWorker
from worldcast.engine.errors import ShmFrameRingFull
from worldcast.engine.memory import freeze_startup_objects
from worldcast.engine.process import messages as msg
from worldcast.engine.process.shm_frames import FrameMeta, ShmFrameRing
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.tuning.threads import available_cores

logger = logging.getLogger(__name__)

#: Exit code of an engine process whose device worker died (the server restarts it).
EXIT_WORKER_DIED = 3
#: Exit code of an engine process that could not start (bad weights, a device that is not there).
EXIT_START_FAILED = 4


class _Outbox:
    """Sends to the server from any thread (one lock), bulk messages from a thread of their own so the
    device thread never waits on a moved session's bytes."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self._bulk: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.broken = False
        threading.Thread(target=self._bulk_loop, name="worldcast-engine-bulk", daemon=True).start()

    def send(self, m: object) -> None:
        if self.broken:
            return
        try:
            with self.lock:
                self.conn.send(m)
        except (OSError, ValueError):  # the server is gone; the command loop sees the EOF and exits
            self.broken = True

    def send_later(self, m: object) -> None:
        self._bulk.put(m)

    def _bulk_loop(self) -> None:
        while True:
            self.send(self._bulk.get())


class EngineProcessCore:
    """The engine core's side of one engine process (built by `engine_main`): reads the client's messages, runs the
    device worker, answers with events."""

    def __init__(self, spec: msg.EngineProcessSpec, conn: Connection) -> None:
        from worldcast.models import registry

        self.spec = spec
        self.out = _Outbox(conn)
        self.conn = conn
        for mod in spec.family_modules:
            importlib.import_module(mod)
        self.model = registry.load(spec.model, weights=spec.weights, device=spec.device, options=spec.options)
        self.ring = ShmFrameRing.attach(spec.ring_name, slots=spec.ring_slots, slot_bytes=spec.ring_slot_bytes)
        config = spec.config
        if spec.prior_threads is not None and config.torch_threads is None:
            config = dataclasses.replace(config, torch_threads=spec.prior_threads)
        elif spec.thread_share == 1 and config.torch_threads is None:  # nothing to choose: time nothing
            config = dataclasses.replace(config, torch_threads=1)
        elif spec.thread_share is not None and config.torch_threads is None:
            config = dataclasses.replace(config, reserved_cores=max(0, available_cores() - spec.thread_share))
        self.worker = DeviceWorker(self.model, config, on_frames=self._on_frames, on_error=lambda sid, why: None,
                                   cost=spec.prior_cost)
        self.worker.on_step = self._on_step
        self.core = EngineCore(self.worker, self._emit)
        self._steps: list[msg.StepRecord] = []
        self._steps_lock = threading.Lock()
        self._stop = threading.Event()

    # -- worker callbacks (worker thread) ------------------------------------------------------

    def _on_frames(self, frames: list[FrameOut]) -> None:
        metas = []
        for f in frames:
            try:
                idx = self.ring.write(f.image)
            except ShmFrameRingFull:
                logger.warning("engine %d: frame ring full (the server is not reading): dropped frame %d of "
                               "Session(%s)", self.spec.engine_id, f.frame_index, f.session_id)
                idx = -1  # told without its pixels: the session keeps its place and its chunk record
            except ValueError as e:
                self.core.handle(cmsg.RemoveSession(f.session_id))
                self._emit(cmsg.SessionFailed(f.session_id, str(e)))
                continue
            metas.append(FrameMeta(f.session_id, f.frame_index, idx, tuple(f.image.shape),  # type: ignore[arg-type]
                                   f.present_at_s, f.action_seq, f.epoch, f.timings_ms, f.chunk))
        if metas:
            self.out.send(msg.FramesReady(metas, time.monotonic()))

    def _emit(self, ev: cmsg.Event) -> None:
        """The core's events to the server; a moved session's bytes from the bulk thread."""
        if isinstance(ev, cmsg.SessionFailed):
            self.out.send(ev)
        else:
            self.out.send_later(ev)

    def _on_step(self, plan: StepSchedulerOutput, result: StepRunnerOutput) -> None:
        if plan.kind is None:
            return
        with self._steps_lock:
            self._steps.append(msg.StepRecord(plan.kind, list(plan.session_ids), result.step_time_s,
                                              list(result.failed)))

    # -- status (its own thread) -----------------------------------------------------------------

    def _status_loop(self) -> None:
        while not self._stop.wait(self.spec.status_interval_s):
            if not self.worker.alive:
                self.out.send(msg.EngineFatal(f"device worker died: {self.worker.last_error}"))
                logger.error("engine %d: device worker died; exiting", self.spec.engine_id)
                os._exit(EXIT_WORKER_DIED)
            with self._steps_lock:
                steps, self._steps = self._steps, []
            self.out.send(msg.EngineStatus(self.worker.snapshot, self.worker.stalled_s, steps, self.ring.dropped,
                                           beat_at_s=self.worker.beat_at_s))

    # -- commands (main thread) -----------------------------------------------------------------

    def handle(self, m: object) -> bool:
        """Apply one message; False when the process should end."""
        if isinstance(m, msg.Shutdown):
            return False
        if isinstance(m, cmsg.Command):
            self.core.handle(m)
        else:
            logger.warning("engine %d: unknown command %s", self.spec.engine_id, type(m).__name__)
        return True

    def serve(self) -> None:
        """Warm up, start, and apply commands until told to stop or the server goes away."""
        w = self.worker
        self.out.send(msg.EngineHello(os.getpid(), w.pool.num_slots, w.pool.slot_bytes, self.model.spec.name))
        if self.spec.prior_cost is not None:
            w.resume(self.spec.prior_served)  # the predecessor's threads, dtype, compiled buckets: nothing timed
        elif self.spec.warmup:
            w.warmup()
        frozen = freeze_startup_objects()  # full collections then skip what start-up made (engine/memory.py)
        w.start()
        self.out.send(msg.EngineReady(w.thread_choice, w.snapshot, frozen))
        threading.Thread(target=self._status_loop, name="worldcast-engine-status", daemon=True).start()
        try:
            while True:
                try:
                    m = self.conn.recv()
                except (EOFError, OSError):
                    logger.info("engine %d: the server is gone; stopping", self.spec.engine_id)
                    break
                if not self.handle(m):
                    break
        finally:
            self._stop.set()
            w.stop()
            self.ring.close()


def engine_main(conn: Connection, spec: msg.EngineProcessSpec) -> None:
    """The engine process's entry point (multiprocessing spawn target).

    Exits 0 after `Shutdown` or the server's EOF, `EXIT_START_FAILED` when the model or ring cannot be
    set up (an `EngineFatal` says why), `EXIT_WORKER_DIED` when the device worker dies.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the whole group: the server stops us
    logging.basicConfig(level=spec.log_level,
                        format=f"%(asctime)s %(levelname)s engine[{spec.engine_id}] %(name)s: %(message)s")
    try:
        server = EngineProcessCore(spec, conn)
    except BaseException as e:  # noqa: BLE001 - reported, then the process ends
        logger.exception("engine %d: could not start", spec.engine_id)
        try:
            conn.send(msg.EngineFatal(f"could not start: {type(e).__name__}: {e}"))
        except (OSError, ValueError):
            pass
        os._exit(EXIT_START_FAILED)
    try:
        server.serve()
    except BaseException as e:  # noqa: BLE001
        logger.exception("engine %d: failed", spec.engine_id)
        server.out.send(msg.EngineFatal(f"{type(e).__name__}: {e}"))
        os._exit(EXIT_WORKER_DIED)
    os._exit(0)  # skip interpreter teardown (worker threads, torch): the server has what it needs
