"""The prepared device check: everything worth running when a GPU is lent, in one short command.

    python -m worldcast.engine.gpu_check --out gpu_results/          # on a CUDA machine (well under 10 min)
    python -m worldcast.engine.gpu_check --cpu-smoke --out /tmp/x/   # the same code paths, tiny, on the CPU

Parts (each writes its output into `--out`, so a run's results can be committed; the JSON records the
commit it ran on):
1. `pytest -m gpu`: the Triton ring-attention kernel in bf16 and fp32 against the reference, batched
   vs solo rollouts on CUDA (tests/gpu/).
2. The engine path of each full-size model (`FULL_SIZE_MODELS`, from the registry: random weights at
   the real architecture and geometry, e.g. the causal-Wan 1.3B DiT with LongLive's window and its VAE
   decoder at 480x832, Matrix-Game 2.0's universal model at 352x640 with its encoders) through the
   model, the `StatePool` and the rollout functions the device worker runs, per batch size 1/2/4/8:
   ms per chunk (every denoising step, decode, commit pass; CUDA events), pixel frames/s per session
   and in total, declared state bytes per session by kind, peak device memory.
3. Each family's checkpoint chain (its registry entry's `checkpoint_check`): random checkpoints
   written in the published layouts (causal Wan: Self-Forcing's .pt with EMA weights, LongLive's base +
   rank-256 LoRA, Wan 2.1's release folder), loaded through the family's factory, the state pool sized
   from the device's free memory (`plan_engine_memory`, `--memory-fraction`'s default), then the engine
   path per batch size and, where the family asks, one long session past its trained horizon
   (per-chunk frame statistics and memory in use: a rolling window keeps memory constant).
4. The default model's engine bench on the device: 1 and 4 always-active sessions (`engine/bench.py`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.timing import DeviceTimer
from worldcast.models import registry
from worldcast.models.base import WorldModel
from worldcast.models.spec import ConditioningRequest

#: Models whose served path the GPU check times at full size (random weights at the real architecture).
FULL_SIZE_MODELS = ("causal-wan:1.3b-random", "matrix-game-2:universal-random")
#: The same code paths at tiny sizes, for `--cpu-smoke`.
SMOKE_MODELS = ("causal-wan:tiny", "matrix-game-2:tiny")


def _conditioner(model: WorldModel) -> ScriptedConditioner:
    spec = model.spec
    context = None
    if spec.conditioning.image is None or spec.conditioning.image.default is not None:
        context = model.encode_conditioning(ConditioningRequest())  # the default prompt (or default image)
    return ScriptedConditioner(spec, context=context)


def engine_rows(model: WorldModel, device: str, *, batches: list[int], chunks: int) -> list[dict[str, object]]:
    """Time the served path of `model` per batch size.

    Each chunk runs the rollout functions the device worker runs (every denoising step, decode, commit
    pass) on sessions in one state pool; the first chunk of a session (its first-chunk decode) is not
    timed. Times are device times (CUDA events on a GPU).
    """
    spec = model.spec
    out: list[dict[str, object]] = []
    for b in batches:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session() * b, device=device)
        rs = [ChunkRollout(f"s{i}", model, pool, _conditioner(model), seed=i) for i in range(b)]
        for r in rs:
            r.init(0.0)
        cache, timer = BatchCache(), DeviceTimer(torch.device(device))
        times: dict[str, list[float]] = {"denoise": [], "commit": []}
        for c in range(chunks + 1):  # the first chunk (first-chunk decode) is not timed
            run_chunk_batch(rs, cache, timer=timer)
            samples = timer.drain()
            if c:
                for kind, _, sec in samples:
                    times[kind].append(sec)
        denoise_s = sum(times["denoise"]) / chunks
        commit_s = sum(times["commit"]) / chunks  # decode + commit pass
        chunk_s = denoise_s + commit_s
        frames = spec.frames_per_chunk
        out.append({
            "spec": spec.name, "batch": b, "chunk_ms": chunk_s * 1e3,
            "denoise_ms": denoise_s * 1e3, "decode_commit_ms": commit_s * 1e3,
            "pixel_fps_per_session": frames / chunk_s, "pixel_fps_total": b * frames / chunk_s,
            "state_bytes_per_session": spec.state_bytes_per_session(),
            "state_bytes_by_kind": spec.state_bytes_by_kind(),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0,
        })
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out[-1].items()}), flush=True)
        del rs, pool
    return out


def engine_path(model_name: str, device: str, *, batches: list[int], chunks: int = 3) -> list[dict[str, object]]:
    """`engine_rows` of a registered model, by name (random weights for the full-size variants)."""
    return engine_rows(registry.load(model_name, device=device), device, batches=batches, chunks=chunks)


def long_session(model: WorldModel, device: str, *, chunks: int, horizon_frames: int | None = None
                 ) -> list[dict[str, object]]:
    """One session for `chunks` chunks: per chunk its first latent frame, whether it is past the model's trained
    horizon, the decoded frames' spread and mean absolute change from the previous frame, and the device memory
    in use (which a rolling window keeps constant). With random weights this shows the path and the memory, not
    whether real content drifts; run it with a real checkpoint for that."""
    spec = model.spec
    pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session(), device=device)
    r = ChunkRollout("long", model, pool, _conditioner(model), seed=0)
    r.init(0.0)
    cache, rows, prev = BatchCache(), [], None
    for c in range(chunks):
        first = r.next_latent
        frames = np.stack([f.image for f in run_chunk_batch([r], cache)]).astype(np.float32)
        seq = frames if prev is None else np.concatenate([prev[None], frames])
        past = horizon_frames is not None and first + spec.latent_frames_per_chunk > horizon_frames
        rows.append({"chunk": c, "first_latent": first, "past_horizon": past, "pixel_std": float(frames.std()),
                     "mean_abs_frame_change": float(np.abs(np.diff(seq, axis=0)).mean()),
                     "memory_allocated_bytes": torch.cuda.memory_allocated() if device.startswith("cuda") else 0})
        prev = frames[-1]
    r.close()
    return rows


def checkpoint_chains(device: str, *, smoke: bool, out: Path, batches: list[int], chunks: int,
                      long_chunks: int) -> dict[str, object]:
    """Part 3: every family's `checkpoint_check` models, loaded from the layouts it writes, through the engine."""
    from worldcast.engine.device_worker import EngineConfig, plan_engine_memory

    report: dict[str, object] = {}
    for fam in registry.families():
        if not fam.checkpoint_check:
            continue
        module, _, func = fam.checkpoint_check.partition(":")
        models = getattr(importlib.import_module(module), func)
        root = Path(tempfile.mkdtemp(prefix=f"{fam.name}-chain-", dir=out))
        rows: dict[str, object] = {}
        try:
            for label, model, info in models(device, smoke=smoke, workdir=root):
                plan = plan_engine_memory(model, EngineConfig(max_batch=max(batches)))
                entry = dict(info) | {
                    "model": model.spec.name, "memory_plan": plan.describe(), "sessions_that_fit": plan.fit_slots,
                    "state_bytes_by_kind": plan.by_kind,
                    "rows": engine_rows(model, device, batches=[b for b in batches if b <= plan.num_slots],
                                        chunks=chunks)}
                if info.get("long_session"):
                    entry["long_session"] = long_session(model, device, chunks=long_chunks,
                                                         horizon_frames=info.get("horizon_frames"))
                rows[label] = entry
                del model
        finally:
            shutil.rmtree(root, ignore_errors=True)
        report[fam.name] = rows
    return report


def commit() -> str:
    """The commit the check ran on (`git rev-parse HEAD`; "unknown" outside a checkout)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m worldcast.engine.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the results (created)")
    ap.add_argument("--cpu-smoke", action="store_true", help="run every part's code on the CPU at tiny sizes")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--models", nargs="+", default=None, metavar="NAME[:VARIANT]",
                    help=f"registered models whose served path to time (default: {' '.join(FULL_SIZE_MODELS)}; "
                         f"with --cpu-smoke: {' '.join(SMOKE_MODELS)})")
    ap.add_argument("--skip-chains", action="store_true", help="skip part 3 (the families' checkpoint chains)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke", file=sys.stderr)
        return 2
    device = "cpu" if args.cpu_smoke else "cuda"
    report: dict[str, object] = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                                 "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                 "commit": commit()}
    rc = 0
    if not args.skip_tests:
        t = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/gpu"],
                           capture_output=True, text=True, timeout=300)
        (args.out / "pytest_gpu.txt").write_text(t.stdout + t.stderr)
        report["pytest_gpu_rc"] = t.returncode
        print(t.stdout[-2000:], flush=True)
        rc |= t.returncode not in (0, 5)  # 5: nothing collected (no GPU tests selected on this machine)
    batches = [1, 2] if args.cpu_smoke else [1, 2, 4, 8]
    chunks = 1 if args.cpu_smoke else 3
    models = args.models or (SMOKE_MODELS if args.cpu_smoke else FULL_SIZE_MODELS)
    report["engine"] = {name: engine_path(name, device, batches=batches, chunks=chunks) for name in models}
    if not args.skip_chains:
        report["checkpoint_chains"] = checkpoint_chains(device, smoke=args.cpu_smoke, out=args.out, batches=batches,
                                                        chunks=chunks, long_chunks=8 if args.cpu_smoke else 12)
    if not args.cpu_smoke:
        from worldcast.engine.bench import run_mode

        tw = registry.load(registry.DEFAULT_MODEL, device=device)
        report["default_model_bench"] = [run_mode(tw, sessions=n, seconds=10, max_batch=8, threads=None)
                                         for n in (1, 4)]
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {args.out / 'gpu_check.json'}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
