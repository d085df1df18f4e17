"""Choosing torch's intra-op thread count by measurement.

How many intra-op threads make a chunk fastest depends on the machine: on
a 2-vCPU VM two threads measured 30-50x slower than one for the model's
small matmuls (each parallel region pays a cross-core wake-up that costs
more than the work), while on a big host more threads win. So the device
worker times its warm-up chunk under each candidate count and keeps the
fastest (`choose_threads`).

Other work shares the cores with the device worker: the event loop,
aiortc's video encoders, the prompt encoder. A count that takes every core
leaves them none, and under that contention the extra intra-op threads
thrash. So only counts that leave `reserved_cores` free are eligible
(`eligible_threads`); every candidate up to the core count is still timed
and reported, so the log and `/metrics` show what the reservation cost.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

#: Most thread counts timed at start-up (bounds the warm-up on big hosts).
MAX_CANDIDATES = 8


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask; cgroup quotas are not read)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def candidate_threads(cores: int) -> list[int]:
    """Thread counts to time: 1..cores, at most `MAX_CANDIDATES` of them (powers of two beyond 4)."""
    if cores <= MAX_CANDIDATES:
        return list(range(1, cores + 1))
    out = [1, 2, 3, 4]
    n = 8
    while n < cores and len(out) < MAX_CANDIDATES - 1:
        out.append(n)
        n *= 2
    return out + [cores]


def eligible_threads(cores: int, reserved_cores: int) -> int:
    """The most intra-op threads that leave `reserved_cores` for the rest of the process (at least 1)."""
    return max(1, cores - max(0, reserved_cores))


@dataclass(frozen=True)
class ThreadChoice:
    """The outcome of `choose_threads`.

    Attributes:
        threads: the chosen intra-op thread count.
        chunk_s: median measured chunk time per timed thread count, s.
        eligible: the most threads the choice could take (cores minus reserved).
        measured: False when the count was given (`--threads`), not measured.
    """

    threads: int
    chunk_s: dict[int, float]
    eligible: int
    measured: bool = True

    def describe(self) -> str:
        """One log line: the choice and every timing."""
        if not self.measured:
            return f"{self.threads} intra-op thread(s) (set by configuration)"
        timings = ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in sorted(self.chunk_s.items()))
        return (f"{self.threads} intra-op thread(s), the fastest of 1..{self.eligible} "
                f"(chunk time by thread count: {timings})")


def choose_threads(time_chunk: Callable[[], float], *, cores: int, reserved_cores: int = 1,
                   repeats: int = 3) -> ThreadChoice:
    """Time one chunk under each candidate thread count and keep the fastest eligible one.

    Rounds interleave the candidates (1, 2, ..., 1, 2, ...) so a drift in the
    machine's speed (steal time, another process) affects them alike; each
    count's first chunk is discarded (one-time costs of a new thread pool).
    Leaves torch set to the chosen count.

    Args:
        time_chunk: runs one chunk under the current `torch.get_num_threads()` and returns its
            duration, s.
        cores: cores available to the process.
        reserved_cores: cores left to other work (event loop, encoders): counts above
            `cores - reserved_cores` are timed and reported but never chosen.
        repeats: timed chunks per candidate (the median is kept).

    Returns:
        the choice, with every candidate's median chunk time.
    """
    cands = candidate_threads(cores)
    eligible = eligible_threads(cores, reserved_cores)
    samples: dict[int, list[float]] = {n: [] for n in cands}
    for n in cands:  # untimed: the first chunk of a new thread count pays its pool's start-up
        torch.set_num_threads(n)
        time_chunk()
    for _ in range(repeats):
        for n in cands:
            torch.set_num_threads(n)
            samples[n].append(time_chunk())
    chunk_s = {n: statistics.median(s) for n, s in samples.items()}
    best = min((n for n in cands if n <= eligible), key=lambda n: (chunk_s[n], n))
    torch.set_num_threads(best)
    return ThreadChoice(threads=best, chunk_s=chunk_s, eligible=eligible)
