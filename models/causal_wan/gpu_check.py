"""Model-level speed and memory check of the full causal Wan 1.3B path on one CUDA device.

    python -m worldcast.models.causal_wan.gpu_check            # CUDA: 1.3B, 480x832, batch 1/2/4/8 (--preset)
    python -m worldcast.models.causal_wan.gpu_check --cpu-smoke  # the same code on `tiny`, CPU, seconds

Random bf16 weights (the architecture, not a checkpoint). One chunk = 4
denoising steps (Self-Forcing's warped timesteps, fresh noise between steps)
+ the commit pass (kv_only) + the VAE decode of the chunk's 3 latent frames
to 12 pixel frames with the session's decoder cache, timed with CUDA events.
Self-attention runs against `RingAttention`: per layer one preallocated
(B, H, window + chunk, hd) buffer that the chunk's keys are written into in
place and SDPA reads whole (the steady state of a full rolling window, every
slot visible, so no mask), i.e. what an in-place pool costs, not the engine
itself. Reports ms per chunk (and its parts), pixel frames/s per session
and in total, per-session bytes of KV window, prompt cache and decoder
cache, and peak device memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from worldcast.models.causal_wan.config import CausalWanConfig, tiny
from worldcast.models.causal_wan.dit import KV, CausalWanDiT
from worldcast.models.causal_wan.presets import PRESETS
from worldcast.models.causal_wan.sampler import flow_to_x0, renoise
from worldcast.models.causal_wan.vae import WanVAEDecoder, frames_to_uint8


class RingAttention:
    """Steady-state in-place KV ring for a batch: per layer K, V (B, H, W + N, hd), W window tokens.

    `attend` writes the chunk's k, v into the last N slots and attends over all
    W + N (in steady state every cached frame of a full window is visible);
    `commit` copies the chunk's keys over the oldest non-sink frames.
    """

    def __init__(self, cfg: CausalWanConfig, batch: int, tokens_per_frame: int, *, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        self.cfg = cfg
        self.T = tokens_per_frame
        self.W = cfg.kv_cache_frames * tokens_per_frame
        self.N = cfg.frames_per_chunk * tokens_per_frame
        self.sink = cfg.sink_size * tokens_per_frame
        shape = (batch, cfg.heads, self.W + self.N, cfg.head_dim)
        g = torch.Generator(device=device).manual_seed(0)
        self.k = [torch.randn(shape, generator=g, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.v = [torch.randn(shape, generator=g, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.ptr = 0

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kb, vb = self.k[layer], self.v[layer]
        kb[:, :, self.W :].copy_(k.transpose(1, 2))
        vb[:, :, self.W :].copy_(v.transpose(1, 2))
        return F.scaled_dot_product_attention(q.transpose(1, 2), kb, vb).transpose(1, 2)

    def commit(self, kv: list[KV]) -> None:
        ring = self.W - self.sink
        start = self.sink + (self.ptr * self.N) % ring if ring else 0
        n = min(self.N, self.W - start)
        for layer, (k, v) in enumerate(kv):
            self.k[layer][:, :, start : start + n].copy_(k[:, :n].transpose(1, 2))
            self.v[layer][:, :, start : start + n].copy_(v[:, :n].transpose(1, 2))
        self.ptr += 1


@dataclass
class BatchResult:
    """One batch size's measurements (ms are means over the timed chunks)."""

    batch: int
    chunk_ms: float  #: 4 denoising steps + commit pass + decode
    denoise_ms: float
    commit_ms: float
    decode_ms: float
    pixel_fps_per_session: float  #: pixel frames per second each session gets
    pixel_fps_total: float
    peak_bytes: int  #: peak device memory during the batch (0 on CPU)


class _Timer:
    """CUDA events on CUDA, perf_counter elsewhere; `mark()` then `elapsed_ms()` per interval."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def session_bytes(cfg: CausalWanConfig, vae: WanVAEDecoder, height: int, width: int, elem: int) -> dict[str, int]:
    """Per-session state bytes: KV window, cross-attention cache, decoder cache."""
    T = cfg.tokens_per_frame(height, width)
    kv = 2 * cfg.layers * cfg.kv_cache_frames * T * cfg.dim * elem
    cross = 2 * cfg.layers * cfg.text_len * cfg.dim * elem
    return {"kv_window": kv, "cross_attn": cross, "decoder_cache": vae.cache_bytes(height, width)}


def run_batch(dit: CausalWanDiT, vae: WanVAEDecoder, batch: int, *, height: int, width: int, chunks: int,
              device: torch.device, vae_frames_per_call: int | None = 1) -> BatchResult:  # fmt: skip
    """Warm up one chunk, then time `chunks` steady-state chunks of `batch` sessions."""
    cfg = dit.cfg
    h, w = cfg.latent_size(height, width)
    T = cfg.tokens_per_frame(height, width)
    Fn = cfg.frames_per_chunk
    g = torch.Generator(device=device).manual_seed(batch)
    ctx = torch.randn(batch, cfg.text_len, cfg.text_dim, generator=g, device=device, dtype=dit.dtype)
    ckv = dit.cross_kv(ctx)
    ring = RingAttention(cfg, batch, T, dtype=dit.dtype, device=device)
    first = torch.randn(batch, cfg.out_channels, Fn, h, w, generator=g, device=device)
    _, cache = vae.decode_chunk(first, None, first_chunk=True)
    ts = cfg.timesteps
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)

    def chunk(index: int, timer: _Timer | None) -> None:
        nonlocal cache
        off = torch.full((batch,), cfg.sink_size + cfg.kv_cache_frames + index * Fn, dtype=torch.int64,
                         device=device)  # fmt: skip
        x = torch.randn(batch, cfg.in_channels, Fn, h, w, generator=g, device=device)
        x0 = x
        if timer:
            timer.mark()
        for i, t in enumerate(ts):
            tt = torch.full((batch,), t, dtype=torch.float64, device=device)
            flow = dit(x, tt, off, ckv, ring).flow
            assert flow is not None
            x0 = flow_to_x0(flow, x, tt)
            if i + 1 < len(ts):
                nxt = torch.full((batch,), ts[i + 1], dtype=torch.float64, device=device)
                x = renoise(x0, torch.randn(x0.shape, generator=g, device=device), nxt)
        if timer:
            timer.mark()
        tc = torch.full((batch,), cfg.context_noise, dtype=torch.float64, device=device)
        ring.commit(dit(x0, tc, off, ckv, ring, kv_only=True).kv)
        if timer:
            timer.mark()
        frames, cache = vae.decode_chunk(x0, cache, first_chunk=False, frames_per_call=vae_frames_per_call)
        frames_to_uint8(frames)
        if timer:
            timer.mark()

    chunk(0, None)  # warm-up (kernel selection, allocator)
    parts = []
    for c in range(chunks):
        timer = _Timer(device)
        chunk(c + 1, timer)
        parts.append(timer.intervals_ms())
    den, com, dec = (sum(p[i] for p in parts) / chunks for i in range(3))
    total = den + com + dec
    per_session = cfg.pixel_frames(Fn, first_chunk=False) / (total / 1e3)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return BatchResult(batch, total, den, com, dec, per_session, per_session * batch, peak)


def build(cfg: CausalWanConfig, *, dtype: torch.dtype, device: torch.device) -> tuple[CausalWanDiT, WanVAEDecoder]:
    """Random-weight DiT and VAE decoder, built directly on `device`."""
    with torch.device(device):
        torch.manual_seed(0)
        dit = CausalWanDiT(cfg).cast(dtype).eval()
        vae = WanVAEDecoder(cfg.vae).to(dtype).eval()
    return dit, vae


def main(argv: list[str] | None = None, *, out: Callable[[str], None] = print) -> list[BatchResult]:
    """CLI entry: see the module docstring. Returns the measurements (also printed, and written by --json)."""
    p = argparse.ArgumentParser(prog="python -m worldcast.models.causal_wan.gpu_check", description=__doc__)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny config on CPU (CI check of this code path)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated (default 1,2,4,8; smoke 1,2)")
    p.add_argument("--chunks", type=int, default=None, help="timed chunks per batch size (default 3; smoke 1)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="longlive",
                   help="window, sinks and steps of this checkpoint family (presets.py; default longlive)")
    p.add_argument("--local-attn-size", type=int, default=None, help="override the preset's latent frames attended")
    p.add_argument("--sink-size", type=int, default=None, help="override the preset's sink latent frames")
    p.add_argument("--vae-frames-per-call", type=int, default=1, help="latent frames per decoder pass (memory)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    a = p.parse_args(argv)

    if a.cpu_smoke:
        device, dtype = torch.device("cpu"), torch.float32
        cfg = tiny(local_attn_size=9, sink_size=3)
        sizes, chunks = [1, 2], a.chunks or 1
    else:
        if not torch.cuda.is_available():
            p.error("no CUDA device (use --cpu-smoke to check the code path on CPU)")
        device, dtype = torch.device("cuda"), torch.bfloat16
        torch.backends.cudnn.benchmark = True
        over = {k: v for k, v in (("local_attn_size", a.local_attn_size), ("sink_size", a.sink_size)) if v is not None}
        cfg = PRESETS[a.preset].config(**over)
        sizes, chunks = [1, 2, 4, 8], a.chunks or 3
    if a.batch_sizes:
        sizes = [int(s) for s in a.batch_sizes.split(",")]
    height, width = cfg.frame_height, cfg.frame_width
    t0 = time.perf_counter()
    dit, vae = build(cfg, dtype=dtype, device=device)
    elem = torch.empty((), dtype=dtype).element_size()
    state = session_bytes(cfg, vae, height, width, elem)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out(f"causal-wan gpu_check on {dev_name}: {dit.num_params() / 1e6:.2f} M DiT params ({dtype}), "
        f"{height}x{width}, window {cfg.local_attn_size} latent frames ({cfg.sink_size} sinks), "
        f"timesteps {[round(t, 2) for t in cfg.timesteps]}, built in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    out("per-session state bytes: " + ", ".join(f"{k} {v / 1e6:.3f} MB" for k, v in state.items())
        + f", total {sum(state.values()) / 1e6:.3f} MB")  # fmt: skip
    if cfg.local_attn_size != 21:
        full21 = 2 * cfg.layers * 21 * cfg.tokens_per_frame(height, width) * cfg.dim * elem
        out(f"(Self-Forcing's global 21-frame KV would be {full21 / 1e6:.3f} MB per session)")
    out(f"{'batch':>5} {'chunk ms':>9} {'denoise':>8} {'commit':>7} {'decode':>7} "
        f"{'fps/session':>11} {'fps total':>9} {'peak GB':>8}")  # fmt: skip
    results = []
    for b in sizes:
        r = run_batch(dit, vae, b, height=height, width=width, chunks=chunks, device=device,
                      vae_frames_per_call=a.vae_frames_per_call)  # fmt: skip
        results.append(r)
        out(f"{r.batch:>5} {r.chunk_ms:>9.1f} {r.denoise_ms:>8.1f} {r.commit_ms:>7.1f} {r.decode_ms:>7.1f} "
            f"{r.pixel_fps_per_session:>11.2f} {r.pixel_fps_total:>9.2f} {r.peak_bytes / 1e9:>8.2f}")  # fmt: skip
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev_name, "dtype": str(dtype), "height": height, "width": width,
                       "config": {"local_attn_size": cfg.local_attn_size, "sink_size": cfg.sink_size,
                                  "timesteps": list(cfg.timesteps)},
                       "state_bytes_per_session": state,
                       "results": [asdict(r) for r in results]}, f, indent=2)  # fmt: skip
    return results


if __name__ == "__main__":
    if "--cpu-smoke" in sys.argv:
        torch.set_num_threads(1)  # a shared 2-core CI machine
    main(sys.argv[1:])
