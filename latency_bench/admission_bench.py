"""Admission benchmark: replay a duty-cycle trace against the device worker under each policy.

    python -m worldcast.latency_bench.admission_bench --trace latency_bench/traces/duty30-short.json

No transport: the real device worker, model, cost model and `admission.decide`
on this machine, with scripted sessions that follow the trace (a
`worldcast-trace/1` JSON file, see `latency_bench/traces/README.md`). Each
trace session asks for admission when it arrives; refused, it asks again
after the policy's `retry_after_s` until it leaves. Admitted, it generates
while its trace segment is active and stops costing compute while idle. Its
duty cycle is measured exactly (time wanting frames over time admitted) and
counts once the session has been observed for `min_observation_s`, as in
`SessionManager`. Per policy it reports sessions admitted, refusals, peak
concurrently admitted, frames, and the share of frames on time (delivered
less than one frame period after their presentation time).

This isolates the admission policy and the scheduler from the transport,
whose encoders and clients share the CPU with the device on a small
machine (see BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy, DutyCyclePrior, SessionLoad, decide
from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.latency_bench.engine_bench import _Collector
from worldcast.models import registry
from worldcast.models.base import WorldModel


@dataclass
class _TraceSession:
    """A trace session: active segments (absolute monotonic times) and its admission record."""

    id: str
    arrive_s: float
    leave_s: float
    active: list[tuple[float, float]]
    admitted_s: float | None = None
    next_try_s: float = 0.0
    refusals: int = 0
    left: bool = False

    def wants(self, now: float) -> bool:
        return any(a <= now < b for a, b in self.active)

    def duty(self, now: float) -> float:
        """Exact share of time wanting frames since admission."""
        if self.admitted_s is None or now <= self.admitted_s:
            return 1.0
        on = sum(max(0.0, min(b, now) - max(a, self.admitted_s)) for a, b in self.active)
        return on / (now - self.admitted_s)


def load_trace(path: Path) -> dict[str, Any]:
    """The trace file as JSON (validated by `latency_bench/trace.py`; here only read).

    Raises:
        ValueError: not a worldcast-trace/1 file.
    """
    d = json.loads(Path(path).read_text())
    if d.get("format") != "worldcast-trace/1":
        raise ValueError(f"{path}: not a worldcast-trace/1 file")
    return d


def replay(model: WorldModel, trace: dict[str, Any], config: AdmissionConfig, *, threads: int | None = None,
           tick_s: float = 0.05) -> dict[str, Any]:
    """Replay `trace` under `config`; returns the policy's numbers."""
    frames = _Collector()
    w = DeviceWorker(model, EngineConfig(torch_threads=threads), on_frames=frames.on_frames,
                     on_error=frames.on_error)
    if threads:
        torch.set_num_threads(threads)
    w.warmup()
    w.start()
    t0 = time.monotonic() + 0.2
    sessions = [_TraceSession(s["id"], t0 + s["arrive_s"], t0 + s["leave_s"],
                              [(t0 + g["start_s"], t0 + g["end_s"]) for g in s["segments"] if g["state"] == "active"])
                for s in trace["sessions"]]
    period = float(model.spec.frame_period)
    keys = model.spec.actions.keys
    right = model.encode_action({keys[min(3, len(keys) - 1)]: True} if keys else {}, {})
    prior = DutyCyclePrior(config.min_observation_s, default=config.default_duty_cycle)
    peak, at_once_s, capacities = 0, 0.0, []
    last = time.monotonic()
    try:
        while (now := time.monotonic()) < t0 + trace["duration_s"]:
            for ts in sessions:
                if ts.admitted_s is not None and not ts.left and now >= ts.leave_s:
                    prior.record_departure(SessionLoad(duty_cycle=ts.duty(now), observed_s=now - ts.admitted_s))
                    w.remove_session(ts.id)
                    ts.left = True
            admitted = [ts for ts in sessions if ts.admitted_s is not None and not ts.left]
            for ts in sessions:
                if ts.admitted_s is not None or not (ts.arrive_s <= now < ts.leave_s) or now < ts.next_try_s:
                    continue
                loads = [SessionLoad(duty_cycle=a.duty(now), observed_s=now - a.admitted_s)  # type: ignore[operator]
                         for a in admitted]
                cap = w.active_capacity(config.target_utilization)
                capacities.append(cap)
                d = decide(config, admitted=loads, active_capacity=cap, kv_free_slots=w.pool.free_slots,
                           prior_duty=prior.value(loads))
                if d.admitted:
                    cond = ScriptedConditioner(model.spec, action=right, wants=lambda ts=ts: ts.wants(time.monotonic()))
                    w.add_session(ts.id, cond, seed=len(admitted))
                    ts.admitted_s = now
                    admitted.append(ts)
                else:
                    ts.refusals += 1
                    ts.next_try_s = now + d.retry_after_s
            peak = max(peak, len(admitted))
            if now >= t0:
                at_once_s += len(admitted) * (now - max(last, t0))
            last = now
            w.wake()
            time.sleep(tick_s)
    finally:
        w.stop()
    with frames.lock:
        late = [f[2] - f[1] >= period for f in frames.frames]
    return {
        "policy": config.policy.value,
        "arrived": len(sessions),
        "admitted": sum(ts.admitted_s is not None for ts in sessions),
        "refusals": sum(ts.refusals for ts in sessions),
        "peak_admitted_at_once": peak,
        "mean_admitted_at_once": at_once_s / trace["duration_s"],
        "active_capacity": sorted(set(capacities)),
        "frames": len(late),
        "on_time_share": 1.0 - float(np.mean(late)) if late else float("nan"),
        "step_costs_ms": {f"{k}@{b}": round(v * 1e3, 2) for (k, b), (v, _) in w.scheduler.cost.snapshot().items()},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.admission_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True, help="a worldcast-trace/1 JSON file")
    ap.add_argument("--model", default=registry.DEFAULT_MODEL, choices=registry.model_names(), metavar="NAME[:VARIANT]",
                    help="the model, from the registry (default %(default)s)")
    ap.add_argument("--weights", type=Path, default=None, help="its weights (default: the variant's own)")
    ap.add_argument("--policies", nargs="+", default=["always-on", "duty-cycle"],
                    choices=[p.value for p in AdmissionPolicy])
    ap.add_argument("--target-utilization", type=float, default=0.85)
    ap.add_argument("--max-overload", type=float, default=0.05,
                    help="duty-cycle: largest share of time more sessions may generate than fit")
    ap.add_argument("--min-observation", type=float, default=10.0, help="s before a measured duty cycle counts fully")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    model = registry.load(args.model, weights=args.weights)
    trace = load_trace(args.trace)
    configs = [AdmissionConfig(policy=AdmissionPolicy(p), target_utilization=args.target_utilization,
                               max_overload_probability=args.max_overload, min_observation_s=args.min_observation)
               for p in args.policies]
    results = [replay(model, trace, c, threads=args.threads) for c in configs]
    for r in results:
        print(json.dumps(r))
    if len(results) == 2 and results[1]["admitted"]:
        a, b = results
        print(f"{b['policy']} over {a['policy']}: sessions admitted {b['admitted'] / max(1, a['admitted']):.2f}x, "
              f"admitted at once (time mean) {b['mean_admitted_at_once'] / max(1e-9, a['mean_admitted_at_once']):.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
