"""How an engine process is started: its settings, its restart policy, and one incarnation of it.

`spawn` starts one process (multiprocessing's spawn method, one duplex
pipe, a frame ring the server creates and owns); `EngineClient`
(`engine/process/client.py`) drives it and starts a new one after a loss.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from worldcast.engine.cost_model import CostModel
from worldcast.engine.device_worker import EngineConfig
from worldcast.engine.process import messages as msg
from worldcast.engine.process.main import engine_main
from worldcast.engine.process.shm_frames import ShmFrameRing
from worldcast.engine.tuning.compiled import default_cache_dir
from worldcast.engine.tuning.warmup import WarmupReport
from worldcast.models.spec import WorldModelSpec

#: Most bytes of frames an engine's ring holds (large frames get fewer slots).
RING_MAX_BYTES = 256 * 2**20
#: How long a stopping engine process may take to exit before it is killed, s.
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EngineLaunch:
    """How to start an engine process.

    Attributes:
        model: "NAME[:VARIANT]" from the model registry.
        weights: its weights (None: the variant's default).
        options: the family's options by key.
        device: torch device of this engine.
        config: its device worker's settings; a `compile_cache_dir` of None is resolved at construction (the
            environment's TORCHINDUCTOR_CACHE_DIR, else `compiled.default_cache_dir()`), so every incarnation
            uses the same cache.
        thread_share: cores it may take for intra-op threads (CPU engines sharing a host; None: all but
            `config.reserved_cores`).
        family_modules: extra modules the process imports first (each registers a model family).
        log_level: `logging` level in the process.
        status_interval_s: how often the process reports its snapshot, s.
    """

    model: str
    weights: Path | None
    options: dict[str, Any]
    device: str
    config: EngineConfig
    thread_share: int | None = None
    family_modules: tuple[str, ...] = ()
    log_level: int = logging.INFO
    status_interval_s: float = 0.1

    def __post_init__(self) -> None:
        # The compile cache is fixed now, as the server starts: once anything in this process has made a
        # torch.compile wrapper, TorchInductor sets TORCHINDUCTOR_CACHE_DIR to its own default (/tmp/...), and
        # a restarted engine process would inherit that, build every graph cold (115 s to ready, measured)
        # and find no ahead-of-time packages.
        if self.config.compile_cache_dir is None:
            try:
                pinned = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())
            except RuntimeError:  # no home directory: the process resolves it (or fails) itself
                return
            object.__setattr__(self, "config", dataclasses.replace(self.config, compile_cache_dir=pinned))


@dataclass(frozen=True)
class RestartPolicy:
    """When a lost engine process is started again."""

    initial_backoff_s: float = 0.5  #: wait before the first restart, s
    max_backoff_s: float = 30.0  #: the wait doubles after each failed or short-lived incarnation, up to this, s
    stable_s: float = 60.0  #: an incarnation up this long resets the wait, s
    start_timeout_s: float = 600.0  #: model load + warm-up may take this long, s

    def __post_init__(self) -> None:
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError("restart backoff must satisfy 0 < initial <= max")


@dataclass
class Incarnation:
    """One engine process and what belongs to it."""

    number: int
    proc: Any  #: multiprocessing.Process (spawn context)
    conn: Connection
    ring: ShmFrameRing
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    pid: int | None = None
    num_slots: int = 0
    slot_bytes: int = 0
    reader: threading.Thread | None = None  #: its reader thread
    fatal: str | None = None  #: what the process said before exiting
    ready: asyncio.Future[None] | None = None
    ready_at_s: float | None = None
    frames_dropped: int = 0



def ring_for(spec: WorldModelSpec, config: EngineConfig) -> ShmFrameRing:
    """A frame ring for one engine process: slots of one frame of the model's size, enough for a few
    chunks of every session of a full batch (fewer for large frames: at most `RING_MAX_BYTES`)."""
    frame_bytes = spec.frame_height * spec.frame_width * 3
    frames = max(64, 4 * spec.chunk_pixel_frames(0) * max(1, config.max_batch))
    slots = ShmFrameRing.slots_for(frame_bytes=frame_bytes, frames=frames, max_bytes=RING_MAX_BYTES)
    return ShmFrameRing.create(slots=slots, slot_bytes=frame_bytes)


def spawn(engine_id: int, launch: EngineLaunch, *, spec: WorldModelSpec, number: int, warmup: bool,
          prior: tuple[CostModel, int | None, WarmupReport | None] | None) -> Incarnation:
    """Start one engine process (blocking: run it off the event loop).

    Args:
        number: the incarnation's number (1 for the first start).
        prior: the step costs, thread count and warm-up report (its served dtype and compiled buckets) of
            the previous incarnation (a restart skips the warm-up's measurements: `DeviceWorker.resume`).
    """
    la = launch
    ctx = mp.get_context("spawn")
    ring = ring_for(spec, la.config)
    pspec = msg.EngineProcessSpec(
        engine_id=engine_id, model=la.model, weights=la.weights, options=dict(la.options), device=la.device,
        config=la.config, warmup=warmup, ring_name=ring.name, ring_slots=ring.slots,
        ring_slot_bytes=ring.slot_bytes, thread_share=la.thread_share,
        prior_cost=prior[0] if prior else None, prior_threads=prior[1] if prior else None,
        prior_served=prior[2] if prior else None,
        status_interval_s=la.status_interval_s, log_level=la.log_level, family_modules=la.family_modules)
    ours, theirs = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=engine_main, args=(theirs, pspec), name=f"worldcast-engine-{engine_id}", daemon=True)
    try:
        proc.start()
    except BaseException:
        ring.close()
        raise
    finally:
        theirs.close()  # only the child holds its end now: its death is our EOF
    return Incarnation(number, proc, ours, ring)


def exit_reason(inc: Incarnation) -> str:
    """Why an incarnation ended, in words (its exit code or signal, and what it said before)."""
    code = inc.proc.exitcode
    if code is None:
        how = "closed its pipe"
    elif code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"engine process {inc.pid} {how}" + (f": {inc.fatal}" if inc.fatal else "")
