"""Chunk cost of two TinyWorld versions side by side: an earlier commit's code and weights against this checkout's.

    python -m worldcast.models.tinyworld.bench_versions --old 54b9c8d     # TinyWorld 1 (its last commit) vs now

The old version runs from a temporary `git worktree` of `--old` (its own code and shipped weights,
imported through a path shim so the installed package stays this checkout's); each version runs the
chunk bench (`python -m worldcast.latency_bench.engine_bench --chunks`: every declared dtype, eager and compiled,
batch 1, 2 and 4; `worldcast.engine.bench` in a commit from before the benchmarks left engine/) in its own
process, alternating `--rounds` times so both see the same neighbours on a shared machine. Prints one
Markdown table with both versions' rows (median / fastest ms per chunk) and writes every row to `--json`.

Raises SystemExit with git's message when `--old` is not a commit of this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The chunk bench's module, by the file that holds it in a checkout: this one's first, then the earlier layout's.
BENCH_MODULES = {"latency_bench/engine_bench.py": "worldcast.latency_bench.engine_bench",
                 "engine/bench.py": "worldcast.engine.bench"}


def bench_module(checkout: Path) -> str:
    """The chunk bench's module in `checkout` (a commit from before engine/bench.py moved runs it there).

    Raises:
        SystemExit: `checkout` has neither file.
    """
    for path, module in BENCH_MODULES.items():
        if (checkout / path).is_file():
            return module
    raise SystemExit(f"{checkout}: no chunk bench ({' or '.join(BENCH_MODULES)})")


def _bench(module: str, pythonpath: str | None, label: str, batches: list[int], repeats: int, out: Path,
           extra: list[str]) -> list[dict[str, object]]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", module, "--chunks", "--batches", *map(str, batches), "--repeats", str(repeats),
           "--json", str(out), *extra]
    subprocess.run(cmd, env=env, check=True, cwd=tempfile.gettempdir())
    return [r | {"version": label} for r in json.loads(out.read_text())]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the earlier commit (its TinyWorld code and weights)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=20, help="timed chunks per way and batch, per round")
    ap.add_argument("--rounds", type=int, default=2, help="old/new alternations")
    ap.add_argument("--no-compile", action="store_true", help="eager steps only (compiling every bucket of both "
                    "versions takes tens of minutes on 2 cores)")
    ap.add_argument("--json", type=Path, default=Path("bench_results/tinyworld_versions.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        r = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), args.old],
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"git worktree add {args.old}: {r.stderr.strip()}")
        try:
            shim = Path(tmp) / "shim"
            shim.mkdir()
            (shim / "worldcast").symlink_to(old)
            old_module, new_module = bench_module(old), bench_module(REPO)
            rows: list[dict[str, object]] = []
            for i in range(args.rounds):
                extra = ["--no-compile"] if args.no_compile else []
                rows += _bench(old_module, str(shim), f"old {args.old}", args.batches, args.repeats,
                               Path(tmp) / f"old{i}.json", extra)
                rows += _bench(new_module, None, "new", args.batches, args.repeats, Path(tmp) / f"new{i}.json", extra)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    print(table(rows))


def table(rows: list[dict[str, object]]) -> str:
    """Markdown: one row per version x dtype x mode, batch columns; the median over rounds of each round's median
    chunk ms, and the fastest chunk seen."""
    batches = sorted({int(r["batch"]) for r in rows})  # type: ignore[call-overload]
    lines = ["| version | dtype | steps | " + " | ".join(f"batch {b}: median / min ms per chunk" for b in batches)
             + " |", "|" + "---|" * (3 + len(batches))]
    for key in dict.fromkeys((r["version"], r["dtype"], r["mode"]) for r in rows):
        cells = []
        for b in batches:
            rs = [r for r in rows if (r["version"], r["dtype"], r["mode"]) == key and r["batch"] == b]
            if not rs:
                cells.append("-")
                continue
            med = sorted(float(r["median_ms"]) for r in rs)[len(rs) // 2]  # type: ignore[arg-type]
            cells.append(f"{med:.1f} / {min(float(r['min_ms']) for r in rs):.1f}")  # type: ignore[arg-type]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
