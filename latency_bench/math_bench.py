"""How close a chunk's arithmetic runs to the machine's measured matmul rate.

    python -m worldcast.latency_bench.engine_bench --math  # TinyWorld, batch 1 and 4

`chunk_flops` counts the floating-point operations of one chunk (every
denoising step, the decode and the commit pass) with PyTorch's
`FlopCounterMode` (matmuls, batched matmuls and convolutions; elementwise
work is not counted, so the achieved rate is a lower bound of the work
done). `matmul_peak_gflops` times plain matmuls of the model's own shapes
and of 256^3, in the dtype the model computes in (bfloat16 runs on AMX
tiles where the CPU has them), and keeps the fastest: the rate this machine
reaches on dense GEMMs of that precision with the current thread count.
`measure` times chunks of a served batch and matmuls in alternating rounds
(a drift in the machine's speed touches both alike) and reports both. The
model runs in its current precision and steps (`WorldModel.set_precision`,
`compile_steps`: `bench --math --precision bfloat16 --compiled`).

On a CPU both are timed with the thread's CPU time (`time.thread_time`)
when torch runs on one intra-op thread, so a busy machine's steal time does
not count against the model; with more threads, wall time. The minimum over
repeats is kept (the machine's best, not its noise).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.tuning.compiled import StepCompiler
from worldcast.models.base import WorldModel


def _clock() -> Callable[[], float]:
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def best_time_s(fn: Callable[[], object], *, repeats: int) -> float:
    """Fastest of `repeats` runs of `fn`, s (thread CPU time with one torch thread, else wall time)."""
    clock = _clock()
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def matmul_peak_gflops(shapes: list[tuple[int, int, int]] | None = None, *, repeats: int = 20,
                       dtype: torch.dtype = torch.float32) -> float:
    """The best GFLOP/s of plain `dtype` matmuls (M, K) @ (K, N) over `shapes` (and 256^3), on the CPU."""
    return max(_matmul_round(shapes, repeats=repeats, dtype=dtype))


def _matmul_round(shapes: list[tuple[int, int, int]] | None, *, repeats: int,
                  dtype: torch.dtype = torch.float32) -> list[float]:
    out = []
    for m, k, n in list(shapes or []) + [(256, 256, 256)]:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(3):
            a @ b
        reps = max(1, int(1e8 // (2 * m * k * n)))  # ~0.1 GFLOP per timed run
        t = best_time_s(lambda: [a @ b for _ in range(reps)], repeats=repeats)  # noqa: B023
        out.append(2 * m * k * n * reps / t / 1e9)
    return out


def _rollouts(model: WorldModel, batch: int) -> list[ChunkRollout]:
    pool = StatePool(model.spec.states, budget_bytes=model.spec.state_bytes_per_session() * batch)
    rs = [ChunkRollout(f"math{i}", model, pool, ScriptedConditioner(model.spec), seed=i) for i in range(batch)]
    for r in rs:
        r.init(0.0)
    return rs


def _chunk(rs: list[ChunkRollout], cache: BatchCache) -> None:
    run_chunk_batch(rs, cache)


def measure(model: WorldModel, *, batch: int = 1, repeats: int = 30,
            compiler: StepCompiler | None = None) -> dict[str, float]:
    """One chunk of `batch` sessions: FLOPs, fastest time, achieved GFLOP/s, and the machine's matmul peak.

    Args:
        compiler: the compiler the model's steps are wrapped with, if any (FLOPs are counted eager).

    Returns:
        {"batch", "gflop_per_chunk", "gflop_per_frame", "chunk_ms", "achieved_gflops",
        "matmul_peak_gflops" (in the model's compute dtype), "share_of_peak", "threads"}.
    """
    rs = _rollouts(model, batch)
    cache = BatchCache()
    for _ in range(5):
        _chunk(rs, cache)
    counter = FlopCounterMode(display=False)
    buckets = compiler.enabled_buckets() if compiler is not None else ()
    if compiler is not None:
        compiler.enable(())  # FLOPs are counted eager (the same arithmetic; a dispatch mode would retrace graphs)
    with counter:
        _chunk(rs, cache)
    if compiler is not None:
        compiler.enable(buckets)
    flops = float(counter.get_total_flops())
    # interleave the chunk and the matmul timings, so a drift in the machine's speed touches both alike
    t, peak = float("inf"), 0.0
    for _ in range(max(1, repeats // 5)):
        t = min(t, best_time_s(lambda: _chunk(rs, cache), repeats=5))
        peak = max(peak, *_matmul_round([(64 * batch, 192, 576), (64 * batch, 576, 192)], repeats=3,
                                        dtype=model.precision))
    frames = batch * model.spec.frames_per_chunk
    achieved = flops / t / 1e9
    return {"batch": batch, "gflop_per_chunk": flops / 1e9, "gflop_per_frame": flops / 1e9 / frames,
            "chunk_ms": t * 1e3, "achieved_gflops": achieved, "matmul_peak_gflops": peak,
            "share_of_peak": achieved / peak, "threads": torch.get_num_threads()}
