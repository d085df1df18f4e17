"""The prepared device check: everything worth running when a GPU is lent, in one short command.

    python -m worldcast.engine.gpu_check --out gpu_results/          # on a CUDA machine (well under 10 min)
    python -m worldcast.engine.gpu_check --cpu-smoke --out /tmp/x/   # the same code paths, tiny, on the CPU

Parts (each writes its output into `--out`, so a run's results can be committed):
1. `pytest -m gpu`: the Triton ring-attention kernel in bf16 and fp32 against the reference, batched
   vs solo rollouts on CUDA (tests/gpu/).
2. The engine path of each full-size model (`FULL_SIZE_MODELS`, from the registry: random weights at
   the real architecture and geometry, e.g. the causal-Wan 1.3B DiT with LongLive's window and the VAE
   decoder at 480x832) through the model, the `StatePool` and the rollout functions the device worker
   runs, per batch size 1/2/4/8: ms per chunk (every denoising step, decode, commit pass; CUDA events),
   pixel frames/s per session and in total, declared state bytes per session by kind, peak device memory.
3. The default model's engine bench on the device: 1 and 4 always-active sessions (`engine/bench.py`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.timing import DeviceTimer
from worldcast.models import registry
from worldcast.models.spec import ConditioningRequest

#: Models whose served path the GPU check times at full size (random weights at the real architecture).
FULL_SIZE_MODELS = ("causal-wan:1.3b-random",)
#: The same code paths at tiny sizes, for `--cpu-smoke`.
SMOKE_MODELS = ("causal-wan:tiny",)


def engine_path(model_name: str, device: str, *, batches: list[int], chunks: int = 3) -> list[dict[str, object]]:
    """Time the served path of a registered model per batch size (see the module docstring, part 2).

    Each chunk runs the rollout functions the device worker runs (every denoising step, decode, commit
    pass) on sessions in one state pool; the first chunk of a session (its first-chunk decode) is not
    timed. Times are device times (CUDA events on a GPU).
    """
    model = registry.load(model_name, device=device)
    spec = model.spec
    out: list[dict[str, object]] = []
    context = None
    if spec.conditioning.image is None or spec.conditioning.image.default is not None:
        context = model.encode_conditioning(ConditioningRequest())  # the default prompt (or default image)
    for b in batches:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session() * b, device=device)
        rs = [ChunkRollout(f"s{i}", model, pool, ScriptedConditioner(spec, context=context), seed=i)
              for i in range(b)]
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
            "model": model_name, "spec": spec.name, "batch": b, "chunk_ms": chunk_s * 1e3,
            "denoise_ms": denoise_s * 1e3, "decode_commit_ms": commit_s * 1e3,
            "pixel_fps_per_session": frames / chunk_s, "pixel_fps_total": b * frames / chunk_s,
            "state_bytes_per_session": spec.state_bytes_per_session(),
            "state_bytes_by_kind": spec.state_bytes_by_kind(),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0,
        })
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out[-1].items()}), flush=True)
        del rs, pool
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m worldcast.engine.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the results (created)")
    ap.add_argument("--cpu-smoke", action="store_true", help="run every part's code on the CPU at tiny sizes")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--models", nargs="+", default=None, metavar="NAME[:VARIANT]",
                    help=f"registered models whose served path to time (default: {' '.join(FULL_SIZE_MODELS)}; "
                         f"with --cpu-smoke: {' '.join(SMOKE_MODELS)})")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke", file=sys.stderr)
        return 2
    device = "cpu" if args.cpu_smoke else "cuda"
    report: dict[str, object] = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                                 "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
    rc = 0
    if not args.skip_tests:
        t = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/gpu"],
                           capture_output=True, text=True, timeout=300)
        (args.out / "pytest_gpu.txt").write_text(t.stdout + t.stderr)
        report["pytest_gpu_rc"] = t.returncode
        print(t.stdout[-2000:], flush=True)
        rc |= t.returncode not in (0, 5)  # 5: nothing collected (no GPU tests selected on this machine)
    models = args.models or (SMOKE_MODELS if args.cpu_smoke else FULL_SIZE_MODELS)
    report["engine"] = {name: engine_path(name, device, batches=[1, 2] if args.cpu_smoke else [1, 2, 4, 8],
                                          chunks=1 if args.cpu_smoke else 3) for name in models}
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
