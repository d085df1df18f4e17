"""The prepared device check: everything worth running when a GPU is lent, in one short command.

    python -m worldcast.engine.gpu_check --out gpu_results/          # on a CUDA machine (well under 10 min)
    python -m worldcast.engine.gpu_check --cpu-smoke --out /tmp/x/   # the same code paths, tiny, on the CPU

Parts (each writes its output into `--out`, so a run's results can be committed):
1. `pytest -m gpu`: the Triton ring-attention kernel in bf16 and fp32 against the reference, batched
   vs solo rollouts on CUDA (tests/gpu/).
2. The causal-Wan chain at full size (`wan_chain`): random bf16 1.3B checkpoints written in the published
   layouts (Self-Forcing's .pt with EMA weights, LongLive's base + rank-256 LoRA, Wan 2.1's release
   folder with its VAE and a one-layer umT5 of the XXL width), loaded through the family's factory
   (presets chosen by file name, EMA, LoRA merged), the state pool sized from the device's free memory
   (`--memory-fraction`'s default), the decode plan, then per preset and batch size 1/2/4/8 the engine
   path (`CausalWanModel`, `StatePool`, the rollout functions the device worker runs) at 480x832: ms per
   chunk (4 denoising steps, decode, commit pass; CUDA events), pixel frames/s per session and in
   total, declared state bytes, peak device memory; and one Self-Forcing session for 12 chunks (past
   its 21-frame horizon): per-chunk frame statistics and memory in use. The JSON records the commit.
3. TinyWorld's engine bench on the device: 1 and 4 always-active sessions (`engine/bench.py`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, denoise_batch, finalize_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.timing import DeviceTimer


def engine_rows(model, device: str, *, batches: list[int], chunks: int) -> list[dict[str, float]]:  # type: ignore[no-untyped-def]
    """Time the served path of `model` per batch size: pool, rollouts, the device worker's step functions."""
    spec = model.spec
    out = []
    prompt = model.encode_prompt(spec.default_prompt)
    for b in batches:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session() * b, device=device)
        rs = [ChunkRollout(f"s{i}", model, pool, ScriptedConditioner(spec, prompt=prompt), seed=i) for i in range(b)]
        for r in rs:
            r.init(0.0)
        cache, timer = BatchCache(), DeviceTimer(torch.device(device))
        times: dict[str, list[float]] = {"denoise": [], "commit": []}
        for c in range(chunks + 1):  # the first chunk (9 frames, first-chunk decode) is not timed
            for r in rs:
                r.begin_chunk(0.0, 0.0)
            for _ in range(spec.denoising_steps):
                tok = timer.start()
                denoise_batch(rs, cache)
                timer.stop(tok, "denoise", b)
            tok = timer.start()
            finalize_batch(rs, 0.0, cache=cache)
            timer.stop(tok, "commit", b)
            samples = timer.drain()
            if c:
                for kind, _, sec in samples:
                    times[kind].append(sec)
        denoise_s = sum(times["denoise"]) / chunks
        commit_s = sum(times["commit"]) / chunks  # decode + commit pass
        chunk_s = denoise_s + commit_s
        frames = spec.frames_per_chunk
        states = {s.name: s.bytes_per_session() for s in spec.states}
        out.append({
            "batch": b, "chunk_ms": chunk_s * 1e3, "denoise_ms": denoise_s * 1e3, "decode_commit_ms": commit_s * 1e3,
            "pixel_fps_per_session": frames / chunk_s, "pixel_fps_total": b * frames / chunk_s,
            "kv_bytes_per_session": states["kv"], "cross_bytes_per_session": states["cross"],
            "decoder_cache_bytes_per_session": sum(v for k, v in states.items() if k.startswith("vae.")),
            "state_bytes_per_session": spec.state_bytes_per_session(),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0,
        })
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out[-1].items()}), flush=True)
        del rs, pool
    return out


def long_session(model, device: str, *, chunks: int) -> list[dict[str, float]]:  # type: ignore[no-untyped-def]
    """One session for `chunks` chunks (past a 21-frame horizon when chunks > 7): per chunk its latent frames,
    the decoded frames' spread and mean absolute change from the previous frame, and the device memory in use
    (which a rolling window keeps constant). With random weights this shows the path and the memory, not
    whether real content drifts; run it with a real checkpoint for that."""
    spec = model.spec
    pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session(), device=device)
    r = ChunkRollout("long", model, pool, ScriptedConditioner(spec, prompt=model.encode_prompt(spec.default_prompt)),
                     seed=0)
    r.init(0.0)
    cache, rows, prev = BatchCache(), [], None
    for c in range(chunks):
        r.begin_chunk(0.0, 0.0)
        for _ in range(spec.denoising_steps):
            denoise_batch([r], cache)
        frames = np.stack([f.image for f in finalize_batch([r], 0.0, cache=cache)]).astype(np.float32)
        seq = frames if prev is None else np.concatenate([prev[None], frames])
        rows.append({"chunk": c, "first_latent": c * spec.latent_frames_per_chunk,
                     "past_horizon": (c + 1) * spec.latent_frames_per_chunk > 21, "pixel_std": float(frames.std()),
                     "mean_abs_frame_change": float(np.abs(np.diff(seq, axis=0)).mean()),
                     "memory_allocated_bytes": torch.cuda.memory_allocated() if device.startswith("cuda") else 0})
        prev = frames[-1]
    r.close()
    return rows


def wan_chain(device: str, *, smoke: bool, out: Path, batches: list[int], chunks: int,
              long_chunks: int) -> dict[str, object]:
    """The causal-Wan chain as a user runs it: checkpoints written in the published layouts (random weights at
    full size: Self-Forcing's .pt with EMA, LongLive's base + LoRA, Wan 2.1's release folder), loaded through
    the family's factory (presets by file name), the state pool sized from the device's memory, the decode
    plan, the served engine path per batch size, and a long Self-Forcing session past its horizon."""
    # the family is named here only until the model registry routes GPU checks (models/registry.py)
    from types import SimpleNamespace

    from worldcast.engine.device_worker import EngineConfig, plan_engine_memory
    from worldcast.models.causal_wan import factory, fullsize
    from worldcast.models.causal_wan.config import WanVAEConfig, tiny, wan_1_3b

    if smoke:
        cfg = tiny(vae=WanVAEConfig(base_dim=4, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                                    latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4))
        dtype = torch.float32
    else:
        cfg, dtype = wan_1_3b(), torch.bfloat16
    root = Path(tempfile.mkdtemp(prefix="wan-chain-", dir=out))
    report: dict[str, object] = {}
    try:
        paths = fullsize.write_layouts(root, cfg, dtype=dtype, text_layers=1,
                                       layouts=frozenset({"wan", "self-forcing", "longlive"}))
        wan = paths["wan 2.1 release folder"]
        for preset, key in (("longlive", "longlive base .pt + lora.pt"),
                            ("self-forcing", "self-forcing .pt (generator + generator_ema)")):
            t0 = time.perf_counter()
            model = factory.load(SimpleNamespace(variant="checkpoint", weights=paths[key], device=device,
                                                 options={"wan_base": wan, "wan_size": "64x64" if smoke else None}))
            load_s = time.perf_counter() - t0
            plan = plan_engine_memory(model, EngineConfig(max_batch=max(batches)))
            rows = engine_rows(model, device, batches=[b for b in batches if b <= plan.num_slots], chunks=chunks)
            report[preset] = {"model": model.spec.name, "source": model.source, "load_s": load_s,
                              "memory_plan": plan.describe(), "sessions_that_fit": plan.fit_slots,
                              "state_bytes_by_kind": plan.by_kind,
                              "decode_latent_frames_per_pass": model.decode_frames_per_call, "rows": rows}
            if preset == "self-forcing":
                report["long_session"] = long_session(model, device, chunks=long_chunks)
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(root, ignore_errors=True)
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
    chain = wan_chain(device, smoke=args.cpu_smoke, out=args.out, batches=[1, 2] if args.cpu_smoke else [1, 2, 4, 8],
                      chunks=1 if args.cpu_smoke else 3, long_chunks=8 if args.cpu_smoke else 12)
    report["causal_wan_chain"] = chain
    report["causal_wan_engine"] = chain["longlive"]["rows"]  # type: ignore[index]
    if not args.cpu_smoke:
        from worldcast.engine.bench import run_mode
        from worldcast.models.tinyworld import TinyWorldModel

        tw = TinyWorldModel.from_pretrained(device=device)
        report["tinyworld_bench"] = [run_mode(tw, sessions=n, seconds=10, max_batch=8, threads=None) for n in (1, 4)]
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {args.out / 'gpu_check.json'}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
