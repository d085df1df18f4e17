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
- `mallopt(M_MMAP_THRESHOLD, 1 MiB)` keeps large blocks (codec buffers, frame
  pools) in their own mappings, returned to the kernel when freed, instead of
  glibc's dynamic threshold, which rises after the first large free and puts
  them on the heap;
- `malloc_trim(0)` after sessions close releases the free pages of every
  arena, from anywhere in the heap (glibc >= 2.8 uses `MADV_DONTNEED` on whole
  free pages). `HeapTrimmer` runs it on a worker thread once closes have
  settled (a burst of closes costs one trim).

Before trimming, the closed sessions' objects must actually be freed: a peer
connection, its tracks and their PyAV codec contexts form reference cycles,
which CPython frees only in a full (generation 2) collection, rare in a
long-running server; their native buffers stay allocated until then. So the
trimmer runs `gc.collect()` first, and the app calls
`engine.memory.freeze_startup_objects` once started (`gc.freeze()`: what start-up made, the model and libraries, is
never scanned again, so that collection takes milliseconds).

Elsewhere (musl, macOS) the glibc calls are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: mallopt parameter numbers (glibc malloc.h): the arena cap, the mmap threshold.
M_ARENA_MAX, M_MMAP_THRESHOLD = -8, -3


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


def fix_mmap_threshold(nbytes: int) -> bool:
    """Serve allocations of `nbytes` or more with mmap, returned to the kernel on free (glibc; setting it
    also turns off glibc's dynamic threshold, which after the first large free rises to 32 MiB and puts
    codec buffers on the heap, where their freed pages stay). Returns whether glibc took it."""
    if _LIBC is None or nbytes < 1:
        return False
    return bool(_LIBC.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(nbytes)))


def configure_malloc(config: MemoryConfig) -> None:
    """Apply `config`'s start-up settings (before threads and codecs allocate; idempotent), here and, through
    glibc's tunables in the environment (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, read at a process's
    start; glibc manual, "Memory Allocation Tunables"), in the engine processes started after it."""
    if config.malloc_arena_max is not None:
        limit_malloc_arenas(config.malloc_arena_max)
        os.environ["MALLOC_ARENA_MAX"] = str(config.malloc_arena_max)
    if config.mmap_threshold_bytes is not None:
        fix_mmap_threshold(config.mmap_threshold_bytes)
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(config.mmap_threshold_bytes)


def trim_heap() -> bool:
    """Return free heap pages of every arena to the kernel (`malloc_trim(0)`). Returns whether any was."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(ctypes.c_size_t(0)))


@dataclass(frozen=True)
class MemoryConfig:
    """How the server gives memory back."""

    malloc_arena_max: int | None = 2  #: cap on glibc malloc arenas, set at start-up (None: glibc's default)
    #: allocations this large or larger are mmapped and unmapped on free, bytes (None: glibc's dynamic threshold)
    mmap_threshold_bytes: int | None = 1 << 20
    trim_after_close_s: float | None = 2.0  #: `malloc_trim` this long after the last session closed, s (None: never)

    def __post_init__(self) -> None:
        if self.malloc_arena_max is not None and self.malloc_arena_max < 1:
            raise ValueError("malloc_arena_max must be >= 1 (or None)")
        if self.mmap_threshold_bytes is not None and not 4096 <= self.mmap_threshold_bytes <= 32 << 20:
            raise ValueError("mmap_threshold_bytes must lie in 4 KiB .. 32 MiB (or None)")
        if self.trim_after_close_s is not None and not 0 <= self.trim_after_close_s < 3600:
            raise ValueError("trim_after_close_s must lie in [0, 3600) s (or None)")


class HeapTrimmer:
    """`delay_s` after the last of a burst of `schedule` calls: a full garbage collection (on the event
    loop), then `trim_heap` on a worker thread.

    Args:
        delay_s: settle time after the last call, s (the closed sessions' peers and encoders free
            their memory as they finish closing).
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._timer: asyncio.TimerHandle | None = None
        self.trims = 0  #: trims run
        self.last_trim_ms: float | None = None  #: how long the last one took, ms
        self.last_collected = 0  #: objects the last full collection freed
        self.last_collect_ms: float | None = None  #: how long it took (on the event loop), ms

    def schedule(self) -> None:
        """Trim `delay_s` from now (pushing back one already due)."""
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.delay_s, self._run, loop)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        # closed sessions' peers, tracks and codec contexts sit in reference cycles, which only a full
        # collection frees (with their native buffers); after `gc.freeze()` at start-up it scans only what
        # was made since, a few ms
        t0 = time.perf_counter()
        self.last_collected = gc.collect()
        self.last_collect_ms = (time.perf_counter() - t0) * 1e3
        loop.run_in_executor(None, self._trim)

    def _trim(self) -> None:
        t0 = time.perf_counter()
        released = trim_heap()
        self.trims += 1
        self.last_trim_ms = (time.perf_counter() - t0) * 1e3
        logger.debug("HeapTrimmer: gc freed %d objects in %.1f ms; malloc_trim took %.1f ms (released: %s)",
                     self.last_collected, self.last_collect_ms, self.last_trim_ms, released)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
