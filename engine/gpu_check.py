"""The prepared device check: everything worth running when a GPU is lent, in one short command.

    python -m worldcast.engine.gpu_check --out gpu_results/          # on a CUDA machine (well under 10 min)
    python -m worldcast.engine.gpu_check --cpu-smoke --out /tmp/x/   # the same code paths, tiny, on the CPU

Parts (each writes its output into `--out`, so a run's results can be committed):
1. `pytest -m gpu`: the Triton ring-attention kernel in bf16 and fp32 against the reference, batched
   vs solo rollouts on CUDA (tests/gpu/).
2. The engine path of causal Wan at full size: the 1.3B DiT (LongLive's window) with random bf16
   weights and the VAE decoder at 480x832 through `CausalWanModel`, the `StatePool` and the rollout
   functions the device worker runs, per batch size 1/2/4/8: ms per chunk (4 denoising steps, decode,
   commit pass; CUDA events), pixel frames/s per session and in total, declared state bytes per
   session (KV ring, cross-attention cache, decoder cache), peak device memory.
3. TinyWorld's engine bench on the device: 1 and 4 always-active sessions (`engine/bench.py`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, denoise_batch, finalize_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.timing import DeviceTimer


def _wan_model(device: str, *, smoke: bool):  # type: ignore[no-untyped-def]
    from worldcast.models.causal_wan.config import longlive_1_3b
    from worldcast.models.causal_wan.dit import CausalWanDiT
    from worldcast.models.causal_wan.loading import CausalWanParts, tiny_parts
    from worldcast.models.causal_wan.model import CausalWanModel
    from worldcast.models.causal_wan.text import TextEncoder
    from worldcast.models.causal_wan.vae import WanVAEDecoder

    if smoke:
        return CausalWanModel(tiny_parts(device=device), name="causal-wan:tiny")
    cfg = longlive_1_3b()
    dtype = torch.bfloat16
    with torch.device(device):
        dit = CausalWanDiT(cfg).cast(dtype).eval()
        vae = WanVAEDecoder(cfg.vae).to(dtype=dtype).eval()
    text = TextEncoder.tiny_random(dim=cfg.text_dim, text_len=cfg.text_len)  # the prompt path only, not umT5-XXL
    text = TextEncoder(text.model.to(device), text.tokenizer, text_len=cfg.text_len)
    return CausalWanModel(CausalWanParts(cfg=cfg, dit=dit, vae=vae, text=text), name="causal-wan:1.3b-random")


def wan_engine_path(device: str, *, smoke: bool, batches: list[int], chunks: int = 3) -> list[dict[str, float]]:
    """Time the served causal-Wan path per batch size (see the module docstring, part 2)."""
    model = _wan_model(device, smoke=smoke)
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
                                 "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
    rc = 0
    if not args.skip_tests:
        t = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/gpu"],
                           capture_output=True, text=True, timeout=300)
        (args.out / "pytest_gpu.txt").write_text(t.stdout + t.stderr)
        report["pytest_gpu_rc"] = t.returncode
        print(t.stdout[-2000:], flush=True)
        rc |= t.returncode not in (0, 5)  # 5: nothing collected (no GPU tests selected on this machine)
    report["causal_wan_engine"] = wan_engine_path(device, smoke=args.cpu_smoke,
                                                  batches=[1, 2] if args.cpu_smoke else [1, 2, 4, 8],
                                                  chunks=1 if args.cpu_smoke else 3)
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
