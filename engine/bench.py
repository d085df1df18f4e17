"""Scheduler benchmark: the device worker alone, no transport, real model and threads.

    python -m worldcast.engine.bench --sessions 4 --seconds 15            # batching on vs off
    python -m worldcast.engine.bench --sessions 6 --seconds 15 --modes on  # one mode

Each session is an always-active scripted conditioner (keys change every
second). Per mode it reports total and per-session delivered frames/s, the
share of frames on time (delivered less than one frame period after their
presentation time), the spread of per-session frames/s around their mean
(fairness), and the measured step costs. Frames are stamped on delivery by
the worker's callback, on the worker's own monotonic clock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.rollout import ChunkInputs
from worldcast.engine.step_output import FrameOut
from worldcast.models.base import WorldModel


class _BenchConditioner:
    """Always active; cycles W, D, S, A once per second."""

    def __init__(self, model: WorldModel, offset: int) -> None:
        self.model, self.offset, self.t0 = model, offset, time.monotonic()
        self.prompt = np.zeros(model.spec.prompt_dim, np.float32)

    def sample_chunk(self, frames: int) -> ChunkInputs:
        key = "wdsa"[(int(time.monotonic() - self.t0) + self.offset) % 4]
        a = np.stack([self.model.encode_action({key: True}, (0.0, 0.0)) for _ in range(frames)])
        return ChunkInputs(actions=a, prompt=self.prompt, action_seq=-1, epoch=0)

    def current_epoch(self) -> int:
        return 0

    def wants_frames(self) -> bool:
        return True


@dataclass
class _Collector:
    frames: list[tuple[str, float, float]] = field(default_factory=list)  # (session, present_at, delivered_at)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_frames(self, frames: list[FrameOut]) -> None:
        now = time.monotonic()
        with self.lock:
            self.frames += [(f.session_id, f.present_at_s, now) for f in frames if f.frame_index > 0]


def run_mode(model: WorldModel, *, sessions: int, seconds: float, max_batch: int, threads: int | None,
             warmup_s: float = 2.0) -> dict[str, object]:
    """Serve `sessions` always-on sessions for `seconds` (after `warmup_s`) and report."""
    col = _Collector()
    w = DeviceWorker(model, EngineConfig(kv_budget_bytes=model.spec.kv.bytes_per_session() * (sessions + 4),
                                         max_batch=max_batch, torch_threads=threads),
                     on_frames=col.on_frames, on_error=lambda s, r: None)
    if threads:
        torch.set_num_threads(threads)
    w.warmup()
    w.start()
    for i in range(sessions):
        w.add_session(f"s{i}", _BenchConditioner(model, i), seed=i)
    time.sleep(warmup_s)
    t0 = time.monotonic()
    time.sleep(seconds)
    t1 = time.monotonic()
    w.stop()
    period = float(model.spec.frame_period)
    with col.lock:
        window = [f for f in col.frames if t0 <= f[2] < t1]
    per = [sum(1 for f in window if f[0] == f"s{i}") / (t1 - t0) for i in range(sessions)]
    mean = statistics.mean(per) if per else 0.0
    on_time = [f[2] - f[1] < period for f in window]
    return {
        "max_batch": max_batch,
        "sessions": sessions,
        "total_fps": sum(per),
        "per_session_fps_mean": mean,
        "per_session_fps_spread": (max(abs(p - mean) for p in per) / mean) if mean else float("nan"),
        "on_time_share": float(np.mean(on_time)) if on_time else float("nan"),
        "step_costs_ms": {f"{k}@{b}": round(v * 1e3, 2) for (k, b), (v, _) in w.scheduler.cost.snapshot().items()},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.engine.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--modes", nargs="+", choices=["on", "off"], default=["on", "off"],
                    help="batching on (max batch 8) and/or off (max batch 1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    from worldcast.models.tinyworld import TinyWorldModel

    model = TinyWorldModel.from_pretrained()
    results = [run_mode(model, sessions=args.sessions, seconds=args.seconds,
                        max_batch=8 if m == "on" else 1, threads=args.threads) for m in args.modes]
    for r in results:
        print(json.dumps(r))
    if len(results) == 2:
        print(f"batching speed-up (total frames/s, on / off): {results[0]['total_fps'] / results[1]['total_fps']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
