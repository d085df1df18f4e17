"""Sizing the state pool from the machine: how much memory the declared per-session state may take.

The budget for every session's declared state (`models/spec.py` StateSpecs:
attention rings, prompt caches, decoder caches, ...) is, unless given in
bytes, a fraction of the memory free on the device once the weights are
loaded: `memory_fraction * free`, read from `torch.cuda.mem_get_info` on a
CUDA device and from the kernel's `MemAvailable` (`/proc/meminfo`) on a CPU.
This is vLLM's `gpu_memory_utilization` applied to what is left after the
weights (vLLM: `vllm/v1/worker/gpu_worker.py`, `determine_available_memory`);
the rest, `(1 - memory_fraction) * free`, is left to activations (one batched
forward, a decode) and to other processes. Slots are capped at `max_slots`
so a large machine does not preallocate state nobody is admitted to use.

Nothing here names a model family: a plan is made from the declared specs,
grouped by kind (the spec class) and by name, and a device that cannot hold
one session is refused with the numbers (`DeviceTooSmall`).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from worldcast.engine.errors import DeviceTooSmall
from worldcast.models.spec import StateSpec

logger = logging.getLogger(__name__)

GiB = 2**30


def fmt_bytes(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1 (GiB, MiB, KiB, B)."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if n < 10 * size else f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class MemoryReading:
    """Free and total memory of a device, bytes, and where the numbers came from."""

    free_bytes: int
    total_bytes: int
    source: str  #: e.g. "torch.cuda.mem_get_info(cuda:0)" or "/proc/meminfo MemAvailable"


#: Reads a device's memory (injectable: tests pass a fake).
MemoryReader = Callable[[torch.device], MemoryReading]


def read_device_memory(device: torch.device, *, meminfo: Path = Path("/proc/meminfo")) -> MemoryReading:
    """Free and total memory of `device` now: CUDA's `mem_get_info`, or the host's available RAM for a CPU.

    Raises:
        OSError: neither /proc/meminfo nor sysconf can tell the host's memory.
    """
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return MemoryReading(int(free), int(total), f"torch.cuda.mem_get_info({device})")
    if meminfo.is_file():
        fields = {}
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024  # kB
        if "MemAvailable" in fields and "MemTotal" in fields:
            return MemoryReading(fields["MemAvailable"], fields["MemTotal"], f"{meminfo} MemAvailable")
    page = os.sysconf("SC_PAGE_SIZE")
    return MemoryReading(os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page,
                         "sysconf available pages")


@dataclass(frozen=True)
class StatePlan:
    """How the state pool is sized: bytes per session by kind and by name, the budget and the slots.

    Attributes:
        by_kind: per-session bytes by spec kind (class name), e.g. {"AttentionRingSpec": ...}.
        names_by_kind: the state names of each kind.
        slot_bytes: bytes of one session's whole declared state.
        budget_bytes: bytes the pool allocates (num_slots * slot_bytes).
        num_slots: sessions whose state fits (>= 1).
        fit_slots: sessions that would fit in the budget before the `max_slots` cap.
        how: where the budget came from, in words.
        reading: the memory reading it was sized from (None: given in bytes).
        headroom_bytes: memory left for activations after the pool (None: unknown, a byte budget).
    """

    by_kind: dict[str, int]
    names_by_kind: dict[str, tuple[str, ...]]
    slot_bytes: int
    budget_bytes: int
    num_slots: int
    fit_slots: int
    how: str
    reading: MemoryReading | None = None
    headroom_bytes: int | None = None

    def describe(self) -> str:
        """The start-up log line (also the dry run's)."""
        def names(n: tuple[str, ...]) -> str:
            return ", ".join(n) if len(n) <= 3 else f"{n[0]}..{n[-1]}: {len(n)} states"

        kinds = "; ".join(f"{k} ({names(self.names_by_kind[k])}) {fmt_bytes(b)}" for k, b in self.by_kind.items())
        cap = "" if self.fit_slots == self.num_slots else f" (capped from {self.fit_slots})"
        head = "" if self.headroom_bytes is None else f"; {fmt_bytes(self.headroom_bytes)} left for activations"
        return (f"state pool: {fmt_bytes(self.slot_bytes)} of declared state per session [{kinds}]; budget "
                f"{fmt_bytes(self.budget_bytes)} ({self.how}) holds {self.num_slots} session(s){cap}{head}")


def plan_state_memory(
    states: tuple[StateSpec, ...], *, state_budget_bytes: int | None, memory_fraction: float, max_slots: int,
    reading: MemoryReading | None,
) -> StatePlan:
    """Size the state pool (see the module docstring).

    Args:
        states: the model's declared per-session state.
        state_budget_bytes: a fixed budget (None: `memory_fraction` of `reading.free_bytes`).
        memory_fraction: share of the free memory after the weights the state may take, in (0, 1].
        max_slots: most slots however much fits.
        reading: the device's memory now (needed when no byte budget is given).

    Raises:
        DeviceTooSmall: not even one session's state fits (the message has the numbers and what to change).
        ValueError: a fraction outside (0, 1], a non-positive budget or cap, no reading to size from.
    """
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must lie in (0, 1], got {memory_fraction}")
    if max_slots < 1:
        raise ValueError("max_slots must be >= 1")
    by_kind: dict[str, int] = {}
    names: dict[str, list[str]] = {}
    for s in states:
        k = type(s).__name__
        by_kind[k] = by_kind.get(k, 0) + s.bytes_per_session()
        names.setdefault(k, []).append(s.name)
    slot = sum(by_kind.values())
    if slot <= 0:
        raise ValueError("a model must declare some per-session state")
    if state_budget_bytes is not None:
        if state_budget_bytes <= 0:
            raise ValueError("state_budget_bytes must be positive")
        budget, how, headroom = state_budget_bytes, f"given: {fmt_bytes(state_budget_bytes)}", None
    else:
        if reading is None:
            raise ValueError("no state budget given and no memory reading to size one from")
        budget = int(memory_fraction * reading.free_bytes)
        how = (f"{memory_fraction:.2f} x {fmt_bytes(reading.free_bytes)} free of {fmt_bytes(reading.total_bytes)} "
               f"after the weights, {reading.source}")
        headroom = None
    fit = budget // slot
    kinds = ", ".join(f"{k} {fmt_bytes(b)}" for k, b in by_kind.items())
    if fit < 1:
        hint = ("raise --state-budget-mib" if state_budget_bytes is not None else
                "raise --memory-fraction, free memory on the device, or use a device with more memory")
        raise DeviceTooSmall(
            f"one session needs {fmt_bytes(slot)} of declared state ({kinds}), but the state budget is "
            f"{fmt_bytes(budget)} ({how}): this device cannot hold one session; {hint}",
            session_bytes=slot, budget_bytes=budget)
    n = min(fit, max_slots)
    if reading is not None:
        headroom = reading.free_bytes - n * slot
    return StatePlan(by_kind=by_kind, names_by_kind={k: tuple(v) for k, v in names.items()}, slot_bytes=slot,
                     budget_bytes=n * slot, num_slots=n, fit_slots=fit, how=how, reading=reading,
                     headroom_bytes=headroom)


def freeze_startup_objects() -> int:
    """Move every object tracked so far to the permanent generation (`gc.freeze`), after a collection, so
    later full collections skip them. Returns how many were frozen.

    Call it once warm-up is done: a warm-up leaves about 640,000 tracked objects (the model, the compiled
    graphs, the libraries), and one full collection over them took 751 ms on a 2-vCPU AVX2 VM (a 2.6 s
    step was seen after a cold compile), holding the GIL, so every session's frames stalled for it (BENCHMARKS.md,
    "CPUs without AMX"; the log line gives the collection's time on the machine at hand). vLLM freezes
    after its warm-up for the same reason.
    """
    t0 = time.perf_counter()
    gc.collect()
    took_s = time.perf_counter() - t0
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("froze %d start-up objects out of garbage collection (a full collection over them took %.0f ms)",
                frozen, took_s * 1e3)
    return frozen
