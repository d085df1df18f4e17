"""Scheduler benchmark: the device worker alone, no transport, real model and threads.

    python -m worldcast.latency_bench.engine_bench --sessions 4 --seconds 15               # batching on vs off
    python -m worldcast.latency_bench.engine_bench --sessions 6 --seconds 15 --modes on    # one mode
    python -m worldcast.latency_bench.engine_bench --faults --sessions 1 --seconds 12      # cancel, exception, NaN
    python -m worldcast.latency_bench.engine_bench --math                                  # GFLOP/s vs the matmul peak
    python -m worldcast.latency_bench.engine_bench --math --precision bfloat16 --compiled  # ... of the precision used
    python -m worldcast.latency_bench.engine_bench --chunks                                # chunk time per way x batch
    python -m worldcast.latency_bench.engine_bench --gil --precision bfloat16              # the GIL held per step

Serving modes warm up as a server does (threads, precision and compiled
steps chosen by measurement) unless `--precision` / `--no-compile` fix them.

Each session is an always-active scripted conditioner (keys change every
second). Per mode it reports total and per-session delivered frames/s, the
share of frames on time (delivered less than one frame period after their
presentation time), the spread of per-session frames/s around their mean
(fairness), the measured step costs, and the full garbage collections in the
window (count, longest ms: each stalls the device thread; after the warm-up
the CLI freezes start-up objects out of collection as the server does,
`engine.memory.freeze_startup_objects`). Frames are stamped on delivery by
the worker's callback, on the worker's own monotonic clock.

`--faults` adds three victim sessions one after another beside the N
others: the first is cancelled (its conditioner bumps the epoch and stops
wanting frames, as `Session.cancel` does), the second raises in its step,
the third produces NaN. It reports, per fault, the steps of the victim that
started after the fault, the victim's frames out of the engine after it and
those a session would publish (its current epoch; `FramePipeline.is_current`, `sessions/frames.py`, drops
older ones), whether the
victim was ended with an error, and how many deadlines (frames more than one
frame period late) the other sessions missed in the second after it and, for
comparison, in the second before it.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.memory import freeze_startup_objects
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.models import registry
from worldcast.models.base import WorldModel


def _conditioner(model: WorldModel, offset: int) -> ScriptedConditioner:
    """Always active; cycles through the model's first four keys once per second (each session `offset` keys
    apart)."""
    t0 = time.monotonic()
    keys = model.spec.actions.keys[:4] or ("",)
    vectors = [model.encode_action({k: True} if k else {}, {}) for k in keys]
    return ScriptedConditioner(model.spec, action=lambda: vectors[(int(time.monotonic() - t0) + offset) % len(vectors)])


@dataclass
class _Collector:
    frames: list[tuple[str, float, float, int]] = field(default_factory=list)  # (session, present_at, out_at, epoch)
    steps: list[tuple[float, list[str]]] = field(default_factory=list)  # (step start, its sessions)
    errors: list[tuple[str, float, str]] = field(default_factory=list)  # (session, at, reason)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_frames(self, frames: list[FrameOut]) -> None:
        now = time.monotonic()
        with self.lock:
            self.frames += [(f.session_id, f.present_at_s, now, f.epoch) for f in frames if f.frame_index > 0]

    def on_step(self, plan: StepSchedulerOutput, result: StepRunnerOutput) -> None:
        with self.lock:
            self.steps.append((time.monotonic() - result.step_time_s, list(plan.session_ids)))

    def on_error(self, sid: str, reason: str) -> None:
        with self.lock:
            self.errors.append((sid, time.monotonic(), reason))


def _serving(model: WorldModel, col: _Collector, *, sessions: int, max_batch: int,
             threads: int | None, precision: str | None = None, compile: bool | None = None,
             freeze: bool = False, compile_buckets: tuple[int, ...] | None = None) -> DeviceWorker:
    """A warmed-up, started device worker serving sessions s0..s{N-1}, reporting to `col`
    (`precision` None: measured; `compile` None: EngineConfig's default; `freeze`: start-up objects frozen
    out of garbage collection after the warm-up, as the server does, `engine.memory.freeze_startup_objects`;
    `compile_buckets` None: EngineConfig's default batch sizes)."""
    extra: dict[str, Any] = {} if compile is None else {"compile": compile}
    if compile_buckets is not None:
        extra["compile_buckets"] = compile_buckets
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * (sessions + 4),
                                         max_batch=max_batch, torch_threads=threads, precision=precision, **extra),
                     on_frames=col.on_frames, on_error=col.on_error)
    w.on_step = col.on_step
    if threads:
        torch.set_num_threads(threads)
    w.warmup()
    if freeze:
        freeze_startup_objects()
    w.start()
    for i in range(sessions):
        w.add_session(f"s{i}", _conditioner(model, i), seed=i)
    return w


def run_faults(model: WorldModel, *, sessions: int, seconds: float, threads: int | None,
               precision: str | None = None, compile: bool | None = None, freeze: bool = False) -> dict[str, object]:
    """N always-on sessions; victims cancelled, failing and NaN-ing one after another (see module doc)."""
    col = _Collector()
    w = _serving(model, col, sessions=sessions, max_batch=8, threads=threads, precision=precision, compile=compile,
                 freeze=freeze)
    period = float(model.spec.frame_period)
    gap = max(3.0, seconds / 3)
    out: dict[str, object] = {"sessions": sessions}
    for name in ("cancel", "raise", "nan"):
        victim = _conditioner(model, 0)
        w.add_session(name, victim, seed=99)
        time.sleep(gap / 2)
        t_fault = time.monotonic()
        if name == "cancel":
            victim.cancel()
        else:
            victim.fault = name
        w.wake()
        time.sleep(gap / 2)
        with col.lock:
            after = [s for s in col.steps if s[0] >= t_fault and name in s[1]]
            out_after = [f for f in col.frames if f[0] == name and f[2] >= t_fault]
            # a session publishes only frames of its current epoch (FramePipeline.is_current drops the rest)
            published = [f for f in out_after if f[3] >= victim.epoch]
            ended = [e for e in col.errors if e[0] == name]
            others = [f for f in col.frames if f[0].startswith("s") and t_fault <= f[2] < t_fault + 1.0]
            before = [f for f in col.frames if f[0].startswith("s") and t_fault - 1.0 <= f[2] < t_fault]
        out[name] = {
            "victim_steps_started_after": len(after),
            "victim_frames_out_after": len(out_after),
            "victim_frames_published_after": len(published),
            "victim_ended_with_error": bool(ended),
            "error": ended[0][2] if ended else None,
            "others_missed_deadlines_next_1s": sum(1 for f in others if f[2] - f[1] >= period),
            "others_frames_next_1s": len(others),
            "others_missed_deadlines_prev_1s": sum(1 for f in before if f[2] - f[1] >= period),
        }
        if name == "cancel":
            w.remove_session(name)
    w.stop()
    return out


class _FullCollections:
    """A `gc.callbacks` entry: the duration of every full (generation 2) collection, s (each holds the GIL,
    stalling the device thread)."""

    def __init__(self) -> None:
        self.took_s: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif info.get("generation") == 2:
            self.took_s.append(time.perf_counter() - self._start)


def run_mode(model: WorldModel, *, sessions: int, seconds: float, max_batch: int, threads: int | None,
             warmup_s: float = 2.0, precision: str | None = None, compile: bool | None = None,
             freeze: bool = False, compile_buckets: tuple[int, ...] | None = None) -> dict[str, object]:
    """Serve `sessions` always-on sessions for `seconds` (after `warmup_s`) and report (`freeze`,
    `compile_buckets`: `_serving`)."""
    col = _Collector()
    w = _serving(model, col, sessions=sessions, max_batch=max_batch, threads=threads, precision=precision,
                 compile=compile, freeze=freeze, compile_buckets=compile_buckets)
    warm = w.snapshot.warmup
    load = os.getloadavg()[0]
    time.sleep(warmup_s)
    full_gc = _FullCollections()
    gc.callbacks.append(full_gc)
    t0 = time.monotonic()
    try:
        time.sleep(seconds)
    finally:
        t1 = time.monotonic()
        gc.callbacks.remove(full_gc)
    w.stop()
    period = float(model.spec.frame_period)
    with col.lock:
        window = [f for f in col.frames if t0 <= f[2] < t1]
    per = [sum(1 for f in window if f[0] == f"s{i}") / (t1 - t0) for i in range(sessions)]
    mean = statistics.mean(per) if per else 0.0
    on_time = [f[2] - f[1] < period for f in window]
    with col.lock:
        batches = [len(ids) for start, ids in col.steps if t0 <= start < t1]
    return {
        "max_batch": max_batch,
        "sessions": sessions,
        "total_fps": sum(per),
        "per_session_fps_mean": mean,
        "per_session_fps_spread": (max(abs(p - mean) for p in per) / mean) if mean else float("nan"),
        "on_time_share": float(np.mean(on_time)) if on_time else float("nan"),
        "mean_step_batch": float(np.mean(batches)) if batches else float("nan"),
        "step_costs_ms": {f"{k}@{b}": round(v * 1e3, 2) for (k, b), (v, _) in w.scheduler.cost.snapshot().items()},
        "precision": warm.precision.dtype if warm else None,
        "compiled_buckets": list(warm.compiled_buckets) if warm else [],
        "load_avg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
        "full_gc": {"count": len(full_gc.took_s), "max_ms": round(max(full_gc.took_s, default=0.0) * 1e3, 1)},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.engine_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=registry.DEFAULT_MODEL, choices=registry.model_names(), metavar="NAME[:VARIANT]",
                    help="the model, from the registry (default %(default)s)")
    ap.add_argument("--weights", type=Path, default=None, help="its weights (default: the variant's own)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--modes", nargs="+", choices=["on", "off"], default=["on", "off"],
                    help="batching on (max batch 8) and/or off (max batch 1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--faults", action="store_true", help="cancel, exception and NaN victims beside N sessions")
    ap.add_argument("--math", action="store_true", help="a chunk's achieved GFLOP/s beside this machine's measured "
                    "matmul peak in the precision used, at batch 1 and 4 (latency_bench/math_bench.py)")
    ap.add_argument("--chunks", action="store_true", help="chunk time per declared dtype x eager/compiled x batch "
                    "(latency_bench/chunk_bench.py)")
    ap.add_argument("--gil", action="store_true", help="main-thread wake delay while a device thread runs chunks, "
                    "eager, from graphs and from packages (latency_bench/gil_bench.py; --precision picks the dtype)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4], help="--chunks: batch sizes")
    ap.add_argument("--repeats", type=int, default=20, help="--chunks: timed chunks per way and batch")
    ap.add_argument("--precision", default=None, help="serve (or --math: run) in this dtype, e.g. float32, "
                    "bfloat16 (default: measured at warm-up; --math: float32)")
    ap.add_argument("--compile", dest="compile", action=argparse.BooleanOptionalAction, default=None,
                    help="compile the model's steps at warm-up where faster (default: on unless WORLDCAST_COMPILE=0)")
    ap.add_argument("--compiled", action="store_true", help="--math: with compiled steps (batch 1 and 4 buckets)")
    ap.add_argument("--freeze", action="store_true", help="--chunks, --math: compile with frozen weights")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("torch", "torch._dynamo", "torch._inductor"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    model = registry.load(args.model, weights=args.weights)
    if args.math:
        _math(model, args)
        return
    if args.chunks:
        from worldcast.latency_bench.chunk_bench import measure_chunks, table

        torch.set_num_threads(args.threads or 1)
        rows = measure_chunks(model, batches=tuple(args.batches), repeats=args.repeats,
                              modes=("eager", "compiled") if args.compile is not False else ("eager",),
                              freeze=args.freeze)
        for r in rows:
            print(json.dumps(r))
        print(table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        return
    if args.gil:
        from worldcast.latency_bench.gil_bench import measure_gil
        from worldcast.models.spec import dtype_from_name

        torch.set_num_threads(args.threads or 1)
        rows = measure_gil(model, dtype_from_name(args.precision or "float32"))
        for r in rows:
            print(json.dumps(r))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        return
    if args.faults:
        print(json.dumps(run_faults(model, sessions=args.sessions, seconds=args.seconds, threads=args.threads,
                                    precision=args.precision, compile=args.compile, freeze=True), indent=2))
        return
    results = [run_mode(model, sessions=args.sessions, seconds=args.seconds, max_batch=8 if m == "on" else 1,
                        threads=args.threads, precision=args.precision, compile=args.compile, freeze=True)
               for m in args.modes]
    for r in results:
        print(json.dumps(r))
    if len(results) == 2:
        print(f"batching speed-up (total frames/s, on / off): {results[0]['total_fps'] / results[1]['total_fps']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def _math(model: WorldModel, args: argparse.Namespace) -> None:
    """`--math`: achieved GFLOP/s of a chunk beside the matmul peak of the dtype it runs in."""
    from worldcast.engine.tuning.compiled import StepCompiler, configure_cache
    from worldcast.engine.tuning.warmup import ChunkRunner, use_way
    from worldcast.latency_bench.math_bench import measure
    from worldcast.models.spec import dtype_from_name

    torch.set_num_threads(args.threads or 1)
    compiler = StepCompiler(model.device, buckets=(1, 4), enabled=args.compiled, freeze=args.freeze)
    dtype = dtype_from_name(args.precision or "float32")
    use_way(model, compiler, dtype, compiled=False)
    if args.compiled:
        configure_cache(None)
        for b in (1, 4):
            with compiler.compiling((b,)):
                ChunkRunner(model, batch=b).chunk()
        compiler.enable((1, 4))
    for b in (1, 4):
        load = os.getloadavg()[0]
        r = measure(model, batch=b, compiler=compiler)
        print(f"batch {b}: {r['gflop_per_frame']:.3f} GFLOP/frame, chunk {r['chunk_ms']:.1f} ms "
              f"({args.precision or 'float32'}, {'compiled' if args.compiled else 'eager'}), "
              f"{r['achieved_gflops']:.1f} GFLOP/s achieved vs {r['matmul_peak_gflops']:.1f} GFLOP/s "
              f"{args.precision or 'float32'} matmul peak = {r['share_of_peak']:.0%} ({r['threads']} thread(s), "
              f"load average {load:.2f})")
        print(json.dumps({k: round(v, 4) for k, v in r.items()} | {"load_avg_1m": round(load, 2)}))


if __name__ == "__main__":
    main()
