"""Give memory back after peaks: glibc malloc arenas and heap trimming.

A server's resident memory after a peak of sessions is mostly freed heap that
glibc keeps: each thread that allocates (the event loop, the device worker,
aiortc's and PyAV's encoder threads, the executor) may get its own malloc
arena (up to 8 per core on 64-bit), and glibc returns an arena's free pages to
the kernel only from the top of the heap, on `free` past `M_TRIM_THRESHOLD`;
pages freed in the middle stay resident. So repeated peaks leave RSS creeping
up (`make rss` measures it). Two glibc calls bound it (glibc manual, "Memory
Allocation Tunables"; mallopt(3), malloc_trim(3)):

- `mallopt(M_ARENA_MAX, n)` at start-up caps the number of arenas (what the
  `MALLOC_ARENA_MAX` environment variable does, set from inside the process so
  `worldcast serve` needs no wrapper);
- `malloc_trim(0)` after sessions close releases the free pages of every
  arena, from anywhere in the heap (glibc >= 2.8 uses `MADV_DONTNEED` on whole
  free pages). `HeapTrimmer` runs it on a worker thread once closes have
  settled (a burst of closes costs one trim).

Elsewhere (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: mallopt parameter number of the arena cap (glibc malloc.h: M_ARENA_MAX).
M_ARENA_MAX = -8


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return lib if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else None  # glibc only


_LIBC = _libc()


def limit_malloc_arenas(n: int) -> bool:
    """Cap glibc's malloc arenas at `n` (arenas already made stay). Returns whether glibc took it."""
    if _LIBC is None or n < 1:
        return False
    return bool(_LIBC.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(n)))


def trim_heap() -> bool:
    """Return free heap pages of every arena to the kernel (`malloc_trim(0)`). Returns whether any was."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(ctypes.c_size_t(0)))


@dataclass(frozen=True)
class MemoryConfig:
    """How the server gives memory back."""

    malloc_arena_max: int | None = 2  #: cap on glibc malloc arenas, set at start-up (None: glibc's default)
    trim_after_close_s: float | None = 2.0  #: `malloc_trim` this long after the last session closed, s (None: never)

    def __post_init__(self) -> None:
        if self.malloc_arena_max is not None and self.malloc_arena_max < 1:
            raise ValueError("malloc_arena_max must be >= 1 (or None)")
        if self.trim_after_close_s is not None and not 0 <= self.trim_after_close_s < 3600:
            raise ValueError("trim_after_close_s must lie in [0, 3600) s (or None)")


class HeapTrimmer:
    """Runs `trim_heap` on a worker thread `delay_s` after the last of a burst of `schedule` calls.

    Args:
        delay_s: settle time after the last call, s (the closed sessions' peers and encoders free
            their memory as they finish closing).
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._timer: asyncio.TimerHandle | None = None
        self.trims = 0  #: trims run
        self.last_trim_ms: float | None = None  #: how long the last one took, ms

    def schedule(self) -> None:
        """Trim `delay_s` from now (pushing back one already due)."""
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.delay_s, self._run, loop)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        loop.run_in_executor(None, self._trim)

    def _trim(self) -> None:
        t0 = time.perf_counter()
        released = trim_heap()
        self.trims += 1
        self.last_trim_ms = (time.perf_counter() - t0) * 1e3
        logger.debug("HeapTrimmer: malloc_trim took %.1f ms (released: %s)", self.last_trim_ms, released)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
