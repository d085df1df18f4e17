"""How long the device thread keeps the interpreter from other threads, per way of running a step.

    python -m worldcast.latency_bench.engine_bench --gil  # float32: eager, graphs, packages if built
    python -m worldcast.latency_bench.engine_bench --gil --precision bfloat16

An engine in the server's process shares the interpreter lock with the
event loop (actions off the data channel, RTP, SCTP, frame events). While a
thread runs chunks of one session in a loop, the main thread sleeps
`sleep_ms` `samples` times and records how much later than asked it woke:
a step that releases the lock while it computes (eager ATen ops, Inductor's
graphs) delays it by little; one that holds it for the whole step delays it
by up to a step. Ahead-of-time packages (`engine/tuning/packages.py`) are run by
`torch._inductor.aoti_load_package`'s loader, which holds it.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from worldcast.engine.tuning.compiled import StepCompiler, configure_cache
from worldcast.engine.tuning.packages import PackageStore
from worldcast.engine.tuning.warmup import ChunkRunner, use_way
from worldcast.models.base import WorldModel
from worldcast.models.spec import dtype_name


def wake_delays_ms(work: ChunkRunner, *, samples: int = 1000, sleep_ms: float = 0.5) -> list[float]:
    """Oversleep of the calling thread, ms, `samples` sleeps of `sleep_ms` each, while another thread runs
    `work`'s chunks without pause (stopped and joined before returning).

    Raises:
        RuntimeError: a chunk raised in the other thread (chained).
    """
    stop = threading.Event()
    failed: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                work.chunk()
        except BaseException as e:  # noqa: BLE001 - re-raised in the measuring thread
            failed.append(e)

    t = threading.Thread(target=loop, name="gil-bench-device", daemon=True)
    t.start()
    out = []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            time.sleep(sleep_ms / 1e3)
            out.append((time.perf_counter() - t0) * 1e3 - sleep_ms)
    finally:
        stop.set()
        t.join()
    if failed:
        raise RuntimeError("the device thread's chunk failed: its delays would measure nothing") from failed[0]
    return out


def measure_gil(model: WorldModel, dtype: torch.dtype, *, samples: int = 1000) -> list[dict[str, object]]:
    """Main-thread wake delay beside a device thread running batch-1 chunks eager, from graphs and (where
    `python -m worldcast.engine.tuning.precompile` built them for `dtype`) from packages.

    Returns:
        one dict per way: {"dtype", "mode", "p50_ms", "p95_ms", "p99_ms", "max_ms", "chunk_ms" (the median
        chunk alone, thread CPU time)}.
    """
    compiler = StepCompiler(model.device, buckets=(1,), enabled=True)
    # first: once a step has run, TorchInductor has set TORCHINDUCTOR_CACHE_DIR to its own default (/tmp/...)
    store = PackageStore.in_cache(configure_cache(None)) if compiler.mode != "eager" else None
    ways: list[tuple[str, ChunkRunner]] = []
    use_way(model, compiler, dtype, compiled=False)
    ways.append(("eager", ChunkRunner(model, batch=1)))
    if store is not None:
        use_way(model, compiler, dtype, compiled=(1,))
        with compiler.compiling((1,)):
            builder = ChunkRunner(model, batch=1)
            builder.chunk()
        builder.close()
        ways.append(("compiled", ChunkRunner(model, batch=1)))
        if compiler.load_packages(store, model.device, (1,)):
            ways.append(("packages", ChunkRunner(model, batch=1)))
    rows: list[dict[str, object]] = []
    for mode, runner in ways:
        use_way(model, compiler, dtype, compiled=False if mode == "eager" else (1,))
        compiler.use_packages([1] if mode == "packages" else [])
        runner.chunk()
        chunk_ms = runner.time_chunks(5) * 1e3
        d = sorted(wake_delays_ms(runner, samples=samples))
        q = statistics.quantiles(d, n=100, method="inclusive")  # within the samples (never past the max)
        rows.append({"dtype": dtype_name(dtype), "mode": mode, "p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2),
                     "p99_ms": round(q[98], 2), "max_ms": round(d[-1], 2), "chunk_ms": round(chunk_ms, 2)})
        runner.close()
    compiler.use_packages([])
    model.set_precision(model.spec.precisions.reference)
    model.compile_steps(None)
    return rows
