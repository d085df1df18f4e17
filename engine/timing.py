"""DeviceTimer: how long device work took, without syncing the host inside a chunk.

On a CPU the work is done when the call returns, so wall time is device
time. On CUDA a call returns once its kernels are queued: wall time would
measure launch overhead, and the cost model, admission and chunk start
times would be wrong by the whole step. So on CUDA each measured region is
bracketed by two timing events (`torch.cuda.Event(enable_timing=True)`)
and read back only once the device has passed the end event (`query()`,
which never blocks); the sample reaches the cost model a step or a chunk
later. `drain()` blocks and is for warm-up only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

#: (step kind, batch size, seconds)
CostSample = tuple[str, int, float]


class DeviceTimer:
    """Times device work on `device` (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: deque[tuple[str, int, Any, Any]] = deque()

    def start(self) -> Any:
        """Mark the start of a region; returns a token for `stop`."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, token: Any, kind: str, batch: int) -> None:
        """Mark the end of the region started with `token`, as one `kind` step of `batch` sessions."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((kind, batch, token, end))
        else:
            self._pending.append((kind, batch, time.perf_counter() - token, None))

    def discard(self, token: Any) -> None:
        """Forget a region that failed (its time is no measure of the device)."""

    def poll(self) -> list[CostSample]:
        """Samples whose regions the device has finished, oldest first (never blocks)."""
        out: list[CostSample] = []
        while self._pending:
            kind, batch, start, end = self._pending[0]
            if end is None:
                out.append((kind, batch, float(start)))
            elif end.query():
                out.append((kind, batch, start.elapsed_time(end) / 1e3))
            else:
                break
            self._pending.popleft()
        return out

    def drain(self) -> list[CostSample]:
        """Wait for the device, then every pending sample (warm-up only: this syncs the host)."""
        if self.cuda:
            torch.cuda.synchronize()
        return self.poll()


def work_clock(device: torch.device) -> Callable[[], float]:
    """The clock warm-up and the benchmarks time device work with, s.

    On a CPU with one intra-op thread: the calling thread's CPU time (`time.thread_time`), so other
    processes on a shared machine and the VM's steal time do not count against the model; with more
    threads, or on an accelerator (where callers synchronise), wall time (`time.perf_counter`).
    """
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter
