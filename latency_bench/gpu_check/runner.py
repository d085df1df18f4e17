"""The prepared device check: what to run first when a GPU is lent, in one command, offline, under 8 minutes.

    make gpu-check OUT=DIR        # on the lent machine (python3 there); the same as:
    python3 latency_bench/gpu_check/launch.py --wheels .gpu-wheels worldcast.latency_bench.gpu_check --out DIR
    make gpu-rehearsal            # here: the same check, CPU, tiny

The lent machine runs its image's `python3` (PyTorch, Triton, numpy, safetensors, transformers,
sentence-transformers; no aiortc, av, fastapi, pydantic or livekit) with no network.
`latency_bench/gpu_check/launch.py` puts the checkout on the path and installs the carried wheels
(`make gpu-wheels`) offline; nothing here imports the network edge.

Parts (`PARTS`, in this order; each in a process of its own with a timeout, so a crash, an out-of-memory
error or a hang fails that part alone and the rest still runs; `parts.py` beside this file holds them):
- environment: Python, library versions, the device;
- pytest_gpu: `pytest -m gpu tests/gpu`;
- ring_attention: the Triton kernel against the PyTorch path at causal Wan 1.3B's shape (max error, time);
- causal_wan: causal Wan 1.3B at 480x832, random weights, bf16, 1 and 2 sessions: chunk ms, frames/s per
  session, the state budget plan, peak device memory;
- matrix_game: Matrix-Game 2.0 universal at full size, random weights, 1 and 3 sessions, likewise;
- tinyworld_eager, tinyworld_graphs: TinyWorld's engine bench at 1/2/4/8 sessions, CUDA graphs off, then on
  (compiling: the last part, so a slow compile costs nothing else; "n/a" on the CPU).
`--parts checkpoint_chains` adds the families' checkpoint chains (generated checkpoints in every published
layout, loaded and served; minutes and gigabytes of temporary files at full size, so not by default).

Every part's timeout is cut to what is left of `--budget-s` (450 s on a GPU), so the whole check ends in
time. Written to `--out` (default $OUT, else gpu_results/): gpu_check.json (every part's status, wall time,
peak device memory, results, and the log's tail of a failed one; the commit), gpu_check.txt (a short table)
and gpu_check.log (every part's output). Exit status 0 when every part passed (or does not apply), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The checkout (parts run from here).
REPO = Path(__file__).resolve().parents[2]
#: The whole check's wall-time budget on a GPU, s (the lent machine's command limit is 10 minutes; the
#: check must leave room for the machine's start and a second try).
GPU_BUDGET_S = 450.0
#: The rehearsal's budget on the CPU, s (a loaded 2-core machine; a normal run takes a few minutes).
CPU_BUDGET_S = 1200.0
#: A part is not started with less than this left, s (importing PyTorch alone takes seconds).
MIN_PART_S = 15.0
#: Characters of a failed part's log kept in the JSON report.
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Part:
    """One isolated part of the check.

    Attributes:
        name: its key in the report.
        target: "module:function"; the function takes `cpu: bool` and returns a JSON-ready dict (with
            `"passed": False` when it ran but found something wrong).
        gpu_timeout_s: its limit on a GPU, s.
        cpu_timeout_s: its limit in the CPU rehearsal, s.
    """

    name: str
    target: str
    gpu_timeout_s: float
    cpu_timeout_s: float

    def __post_init__(self) -> None:
        if ":" not in self.target:
            raise ValueError(f"part target {self.target!r} is not module:function")
        if min(self.gpu_timeout_s, self.cpu_timeout_s) <= 0:
            raise ValueError("part timeouts must be positive")


_P = "worldcast.latency_bench.gpu_check.parts:"
#: The parts run by default, in order (most informative first once the environment is known).
PARTS = (
    Part("environment", _P + "environment", 60, 180),
    Part("pytest_gpu", _P + "pytest_gpu", 120, 300),
    Part("ring_attention", _P + "ring_attention", 60, 240),
    Part("causal_wan", _P + "causal_wan", 120, 400),
    Part("matrix_game", _P + "matrix_game", 120, 400),
    Part("tinyworld_eager", _P + "tinyworld_eager", 90, 300),
    Part("tinyworld_graphs", _P + "tinyworld_graphs", 240, 120),
)
#: Parts run only when named in `--parts`.
OPT_IN_PARTS = (Part("checkpoint_chains", _P + "checkpoint_chains", 300, 600),)


def commit() -> str:
    """The commit the check ran on: $WORLDCAST_COMMIT if set (the lent machine's copy of the tree may have no
    .git), else `git rev-parse HEAD` with "+dirty" for uncommitted changes to tracked files; "unknown" outside a
    checkout or without git."""
    if os.environ.get("WORLDCAST_COMMIT"):
        return os.environ["WORLDCAST_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_part(part: Part, *, cpu: bool, timeout_s: float, log: Path) -> dict[str, Any]:
    """Run `part` in a new process (and process group) for at most `timeout_s` seconds, its output appended to
    `log`.

    Returns:
        {"status": "ok" | "n/a" | "failed" | "timeout", "wall_s", "timeout_s", "returncode", "error" (the last line of
        the failure, or None), "log_tail" (failures only), and from the part's process: "result",
        "peak_memory_bytes" (CUDA allocator peak; None on the CPU), "peak_rss_bytes"}.
    """
    with tempfile.TemporaryDirectory(prefix="worldcast-gpu-check-") as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "worldcast.latency_bench.gpu_check", "--run-part", part.target,
               "--result", str(result_path), *(["--cpu"] if cpu else [])]
        t0 = time.monotonic()
        start = log.stat().st_size if log.exists() else 0
        with open(log, "a") as f:
            f.write(f"==== {part.name} ({'cpu' if cpu else 'gpu'}, timeout {timeout_s:.0f} s)\n")
            f.flush()
            p = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=os.environ | {"PYTHONUNBUFFERED": "1"})
            try:
                rc: int | None = p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # the part and anything it started (pytest, compile workers)
                p.wait()
                rc = None
        wall = time.monotonic() - t0
        with open(log, errors="replace") as f:
            f.seek(start)
            output = f.read()
        got = json.loads(result_path.read_text()) if result_path.exists() else {}
    out: dict[str, Any] = {"wall_s": round(wall, 2), "timeout_s": round(timeout_s, 1), "returncode": rc,
                           "error": None} | got
    if rc is None:
        out |= {"status": "timeout", "error": f"killed after {timeout_s:.0f} s"}
    elif rc != 0 or not got:
        last = [ln for ln in output.strip().splitlines() if ln.strip()]
        out |= {"status": "failed", "error": last[-1] if last else f"exit status {rc}"}
    elif isinstance(got.get("result"), dict) and got["result"].get("passed") is False:
        out |= {"status": "failed", "error": "ran, but its checks did not pass (see result)"}
    elif isinstance(got.get("result"), dict) and got["result"].get("not_applicable"):
        out |= {"status": "n/a", "error": str(got["result"]["not_applicable"])}
    else:
        out["status"] = "ok"
    if out["status"] != "ok":
        out["log_tail"] = output[-LOG_TAIL_CHARS:]
    return out


def run_check(parts: list[Part], *, cpu: bool, out: Path, budget_s: float) -> dict[str, Any]:
    """Run `parts` one after another within `budget_s` seconds in all; write the report, table and log to `out`.

    Returns the report (also `out`/gpu_check.json). A part that finds less than `MIN_PART_S` left is
    "skipped".
    """
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_check.log"
    log.write_text("")
    t0 = time.monotonic()
    report: dict[str, Any] = {"commit": commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "mode": "cpu" if cpu else "gpu", "budget_s": budget_s, "parts": {}}
    for part in parts:
        left = budget_s - (time.monotonic() - t0)
        limit = min(part.cpu_timeout_s if cpu else part.gpu_timeout_s, left)
        if limit < MIN_PART_S:
            report["parts"][part.name] = {"status": "skipped", "error": f"{left:.0f} s of the budget left"}
        else:
            report["parts"][part.name] = run_part(part, cpu=cpu, timeout_s=limit, log=log)
        row = report["parts"][part.name]
        print(f"{part.name}: {row['status']} in {row.get('wall_s', 0)} s" +
              (f" ({row['error']})" if row["error"] else ""), flush=True)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    report["passed"] = all(r["status"] in ("ok", "n/a") for r in report["parts"].values())
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpu_check.txt").write_text("\n".join(table(report)) + "\n")
    return report


def _gib(n: object) -> str:
    if not isinstance(n, int | float):
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def table(report: dict[str, Any]) -> list[str]:
    """The short table: one line per part (status, wall s, peak device memory), then its headline numbers."""
    lines = [f"worldcast device check ({report['mode']}) at {report['commit']}: "
             f"{'passed' if report.get('passed') else 'FAILED'} in {report.get('wall_s', '?')} s",
             f"{'part':<17}{'status':<9}{'wall s':>8}  {'peak device mem':>16}  headline"]
    for name, row in report["parts"].items():
        res = row.get("result") if isinstance(row.get("result"), dict) else {}
        lines.append(f"{name:<17}{row['status']:<9}{row.get('wall_s', 0):>8}  {_gib(row.get('peak_memory_bytes')):>16}"
                     f"  {headline(name, res) if row['status'] == 'ok' else row.get('error')}")
    return lines


def headline(name: str, res: dict[str, Any]) -> str:
    """One part's key numbers in a few words ("" for a part without any)."""
    if name == "environment":
        return f"{res.get('device')}, torch {res.get('torch')}, triton {res.get('triton')}, py {res.get('python')}"
    if name == "pytest_gpu":
        return str(res.get("summary", ""))
    if name == "ring_attention":
        return "; ".join(f"{r['dtype']}: triton "
                         f"{'n/a' if r['triton_ms'] is None else round(r['triton_ms'], 3)} ms, torch "
                         f"{round(r['torch_ms'], 3)} ms, err "
                         f"{r.get('triton_vs_torch_max_abs_err', r.get('torch_vs_reference_max_abs_err')):.2e}"
                         for r in res.get("rows", []))
    if name in ("causal_wan", "matrix_game"):
        plan = res.get("state_plan", {})
        rows = "; ".join(f"{r['batch']}x: {r['chunk_ms']:.0f} ms/chunk, {r['pixel_fps_per_session']:.1f} fps/session"
                         for r in res.get("rows", []))
        return f"{rows}; state {_gib(plan.get('slot_bytes'))}/session, pool holds {plan.get('num_slots')}"
    if name in ("tinyworld_eager", "tinyworld_graphs"):
        return "; ".join(f"{'graphs' if r['cuda_graphs'] else 'eager'} {r['sessions']}x: "
                         f"{r['per_session_fps_mean']:.1f} fps/session" for r in res.get("rows", []))
    return ""


def _run_one(target: str, result: Path, cpu: bool) -> int:
    """In the part's own process: call `target(cpu)` and write its result, wall time and peaks to `result`.

    The peak device memory is the CUDA allocator's peak over the whole process (a fresh one per part); None on
    the CPU or when the part never imported torch.
    """
    module, _, func = target.partition(":")
    t0 = time.perf_counter()
    try:
        res = getattr(importlib.import_module(module), func)(cpu)
    except BaseException:
        traceback.print_exc()
        return 1
    torch = sys.modules.get("torch")
    cuda = torch is not None and not cpu and torch.cuda.is_available()
    result.write_text(json.dumps({"result": res, "part_s": round(time.perf_counter() - t0, 2),
                                  "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                                  "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
                                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024},
                                 default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    names = [p.name for p in PARTS + OPT_IN_PARTS]
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_results"),
                    help="folder for gpu_check.json/.txt/.log (default: $OUT, else gpu_results)")
    ap.add_argument("--cpu", action="store_true", help="the rehearsal: every part's code on the CPU at tiny sizes")
    ap.add_argument("--parts", nargs="+", choices=names, default=None, help="parts to run, in order (default: "
                    f"{' '.join(p.name for p in PARTS)})")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"wall-time budget of the whole check, s (default {GPU_BUDGET_S:.0f}; "
                         f"--cpu: {CPU_BUDGET_S:.0f})")
    ap.add_argument("--run-part", metavar="MODULE:FUNCTION", help=argparse.SUPPRESS)  # a part's own process
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_part:
        return _run_one(args.run_part, args.result, args.cpu)
    by_name = {p.name: p for p in PARTS + OPT_IN_PARTS}
    parts = [by_name[n] for n in args.parts] if args.parts else list(PARTS)
    budget = args.budget_s or (CPU_BUDGET_S if args.cpu else GPU_BUDGET_S)
    report = run_check(parts, cpu=args.cpu, out=args.out, budget_s=budget)
    print("\n".join(table(report)))
    print(f"wrote {args.out / 'gpu_check.json'}, gpu_check.txt, gpu_check.log")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
