"""Chunk time per precision x eager/compiled x batch size, the model alone (no scheduler, no transport).

    python -m worldcast.latency_bench.engine_bench --chunks  # every declared dtype, batch 1, 2, 4
    python -m worldcast.latency_bench.engine_bench --chunks --batches 1 --repeats 40

One way of running the model is a dtype (`spec.precisions.dtypes`) and
eager or compiled steps (`engine/tuning/compiled.py`; graphs built per batch
bucket first, from the on-disk cache when warm). For each way and batch, a
chunk of that many scripted sessions is timed `repeats` times in
interleaved rounds (every way and batch once per round; "packages" too
where `python -m worldcast.engine.tuning.precompile` built that dtype's and
batch's ahead-of-time packages, `engine/tuning/packages.py`) with
`timing.work_clock` (thread CPU time on a one-thread CPU), and the median
and the fastest are reported beside the load average, since on a shared
machine the numbers move with the neighbours' work.
"""

from __future__ import annotations

import logging
import os
import statistics
import time

import torch

from worldcast.engine.tuning.compiled import StepCompiler, configure_cache
from worldcast.engine.tuning.packages import PackageStore
from worldcast.engine.tuning.warmup import ChunkRunner, use_way
from worldcast.models.base import WorldModel
from worldcast.models.spec import dtype_name

logger = logging.getLogger(__name__)


def measure_chunks(model: WorldModel, *, batches: tuple[int, ...] = (1, 2, 4), repeats: int = 20,
                   modes: tuple[str, ...] = ("eager", "compiled"), freeze: bool = False) -> list[dict[str, object]]:
    """Chunk time of every (dtype, mode, batch); see the module docstring.

    Returns:
        one dict per way and batch: {"dtype", "mode", "batch", "median_ms", "min_ms", "per_frame_ms",
        "compile_s" (building or loading that bucket's graphs), "load_avg_1m" (at the start and end)}.
    """
    compiler = StepCompiler(model.device, buckets=batches, enabled="compiled" in modes, freeze=freeze)
    store = None
    if compiler.mode != "eager":
        cache = configure_cache(None)
        store = None if freeze or compiler.mode != "inductor" else PackageStore.in_cache(cache)
    runners: dict[tuple[torch.dtype, str, int], ChunkRunner] = {}
    compile_s: dict[tuple[torch.dtype, int], float] = {}
    load0 = os.getloadavg()[0]
    ways = [(dt, mode) for dt in model.spec.precisions.dtypes for mode in modes
            if mode == "eager" or compiler.mode != "eager"]
    for dt, mode in ways:
        for b in batches:
            use_way(model, compiler, dt, compiled=(b,) if mode == "compiled" else False)
            t0 = time.perf_counter()
            if mode == "compiled":
                with compiler.compiling((b,)):  # the sessions' init (batch 1, padded) builds graphs too
                    r = ChunkRunner(model, batch=b)
                    r.chunk()
                compile_s[dt, b] = time.perf_counter() - t0
                logger.info("bench: %s batch %d graphs ready in %.1f s", dtype_name(dt), b, compile_s[dt, b])
            else:
                r = ChunkRunner(model, batch=b)
            r.chunk()
            runners[dt, mode, b] = r
            if mode == "compiled" and store is not None and compiler.load_packages(store, model.device, (b,)):
                runners[dt, "packages", b] = ChunkRunner(model, batch=b)  # built by `engine/tuning/precompile.py`
                compiler.use_packages([b])
                runners[dt, "packages", b].chunk()
                compiler.use_packages([])
    samples: dict[tuple[torch.dtype, str, int], list[float]] = {k: [] for k in runners}
    for _ in range(repeats):
        for (dt, mode, b), r in runners.items():
            use_way(model, compiler, dt, compiled=(b,) if mode in ("compiled", "packages") else False)
            compiler.use_packages([b] if mode == "packages" else [])
            samples[dt, mode, b].append(r.time_chunks(1))
    for r in runners.values():
        r.close()
    load1 = os.getloadavg()[0]
    frames = model.spec.frames_per_chunk
    out: list[dict[str, object]] = []
    for (dt, mode, b), xs in samples.items():
        mode = "compiled+frozen" if mode == "compiled" and freeze else mode
        med = statistics.median(xs)
        out.append({"dtype": dtype_name(dt), "mode": mode, "batch": b, "median_ms": round(med * 1e3, 2),
                    "min_ms": round(min(xs) * 1e3, 2), "per_frame_ms": round(med * 1e3 / (b * frames), 2),
                    "compile_s": round(compile_s.get((dt, b), 0.0), 1),
                    "load_avg_1m": [round(load0, 2), round(load1, 2)], "threads": torch.get_num_threads()})
    model.set_precision(model.spec.precisions.reference)
    model.compile_steps(None)
    return out


def table(rows: list[dict[str, object]]) -> str:
    """The results as a Markdown table (dtype x mode rows, batch columns: median / fastest ms)."""
    batches = sorted({int(r["batch"]) for r in rows})  # type: ignore[call-overload]
    head = "| dtype | steps | " + " | ".join(f"batch {b}: median / min ms" for b in batches) + " |"
    lines = [head, "|" + "---|" * (2 + len(batches))]
    for key in dict.fromkeys((r["dtype"], r["mode"]) for r in rows):
        cells = []
        for b in batches:
            r = next((r for r in rows if (r["dtype"], r["mode"]) == key and r["batch"] == b), None)
            cells.append("-" if r is None else f"{r['median_ms']} / {r['min_ms']}")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
