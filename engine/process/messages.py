"""What the server and an engine process say to each other over their pipe: plain dataclasses.

The server starts an engine process with an `EngineProcessSpec` (the model by
registry name, never a pickled model) and then sends commands; the engine
sends events back. Every message is small: pixels go through the frame ring
in shared memory (`engine/process/shm_frames.py`), and only a moved session's state
(`engine/session_state.py`) is bulk data. A new session carries its whole
conditioning; later messages carry changes only (vLLM v1's
`NewRequestData` / `CachedRequestData` split, `vllm/v1/core/sched/output.py`).

The sessions' commands and events are the engine contract's, the same for
an engine in the server's process (`engine/messages.py`); this module adds
what only a process needs. Server -> engine: the contract's commands,
`Shutdown`. Engine -> server: the contract's events, `EngineHello`,
`EngineReady`, `FramesReady`, `EngineStatus`, `EngineFatal`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worldcast.engine.cost_model import CostModel
from worldcast.engine.device_worker import EngineConfig, EngineSnapshot
from worldcast.engine.process.shm_frames import FrameMeta
from worldcast.engine.step_output import StepKind
from worldcast.engine.tuning.threads import ThreadChoice
from worldcast.engine.tuning.warmup import WarmupReport


@dataclass(frozen=True)
class EngineProcessSpec:
    """Everything an engine process needs to build its model and serve.

    Attributes:
        engine_id: the engine's id on this server (0, 1, ...).
        model: "NAME[:VARIANT]" from the model registry.
        weights: the model's weights (None: its default).
        options: the family's options by key.
        device: torch device, e.g. "cpu", "cuda:1".
        config: the device worker's settings.
        warmup: measure step costs before reporting ready (skipped when `prior_cost` is given).
        ring_name: the shared-memory block of its frame ring (created by the server).
        ring_slots: frames the ring holds.
        ring_slot_bytes: bytes of one slot.
        thread_share: cores this engine may take for intra-op threads (CPU engines; None: all but
            `config.reserved_cores`).
        prior_cost: step costs the engine's previous process measured (a restart starts from them and
            skips the warm-up timing).
        prior_threads: the thread count its previous process chose (a restart reuses it).
        prior_served: its previous process's warm-up report (a restart serves the same dtype and compiled
            buckets without measuring: `DeviceWorker.resume`).
        status_interval_s: how often it reports its snapshot, s.
        log_level: `logging` level of the process.
        family_modules: extra modules to import before loading (each registers a model family).
    """

    engine_id: int
    model: str
    weights: Path | None
    options: dict[str, Any]
    device: str
    config: EngineConfig
    warmup: bool
    ring_name: str
    ring_slots: int
    ring_slot_bytes: int
    thread_share: int | None = None
    prior_cost: CostModel | None = None
    prior_threads: int | None = None
    prior_served: WarmupReport | None = None
    status_interval_s: float = 0.1
    log_level: int = 20
    family_modules: tuple[str, ...] = ()


# -- server -> engine ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shutdown:
    """Stop the device worker and exit."""


# -- engine -> server ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineHello:
    """The model is loaded and the pool allocated (warm-up follows)."""

    pid: int
    num_slots: int
    slot_bytes: int
    model: str  #: the loaded model's spec name


@dataclass(frozen=True)
class EngineReady:
    """Warmed up and serving."""

    thread_choice: ThreadChoice | None
    snapshot: EngineSnapshot
    frozen_objects: int = 0  #: start-up objects frozen out of garbage collection (`engine/memory.py`)


@dataclass(frozen=True)
class FramesReady:
    """Frames whose pixels are in the ring, in ring order."""

    frames: list[FrameMeta]
    sent_s: float = 0.0  #: CLOCK_MONOTONIC when the engine sent them, s (the server reports the IPC time)


@dataclass(frozen=True)
class StepRecord:
    """One executed step, for the server's metrics."""

    kind: StepKind
    session_ids: list[str]
    step_time_s: float
    failed: list[str]  #: sessions whose step failed


@dataclass(frozen=True)
class EngineStatus:
    """Periodic: the worker's snapshot, its stall time, its heartbeat and the steps since the last status."""

    snapshot: EngineSnapshot
    stalled_s: float
    steps: list[StepRecord] = field(default_factory=list)
    frames_dropped: int = 0  #: frames dropped on a full ring, since the process started
    #: CLOCK_MONOTONIC s at which the device loop last came round (`DeviceWorker.beat_at_s`; the host's
    #: processes share the clock); sent by the status thread, written only by the loop
    beat_at_s: float | None = None


@dataclass(frozen=True)
class EngineFatal:
    """The process is about to exit: why."""

    reason: str
