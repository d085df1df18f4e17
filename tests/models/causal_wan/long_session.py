"""Measure what the Self-Forcing / CausVid long-session policy (a rolling 21-frame window, no sinks) shows
the model past its trained horizon, on the CPU.

    python -m tests.models.causal_wan.long_session

A chunk past the horizon (first latent frame 18 + d) with the rolled window holding frames d..17+d sees the
same latents as the horizon's last chunk (frame 18 over frames 0..17), shifted by d frames. Wan's RoPE is
relative in time, so if the policy is what it claims, the chunk's output is the horizon's last chunk's
output for every d (up to rounding): the model is given exactly the relative frame offsets (0..20) and
the amount of context it was trained on. With 3 sinks (LongLive's rule applied to a model trained without
them) the sinks sit d frames further back than anything in training and the output moves away.

The numbers come from the Self-Forcing fixture's weights (seeded, untrained); what this measures is the
geometry of the inputs the network sees, not the content it would generate: whether real Self-Forcing
weights drift over minutes needs the real checkpoint on a GPU (`python -m worldcast.latency_bench.gpu_check --parts
checkpoint_chains` runs a long session and records per-chunk frame statistics).
"""

from __future__ import annotations

import argparse

import torch

from tests.models.causal_wan.test_reference_parity import fixture, our_config, our_dit
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import CausalWanDiT


def chunk_at(dit: CausalWanDiT, past: torch.Tensor, x: torch.Tensor, t: float, cross: list, *, start: int,
             sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The flow of chunk `x` at first frame `start` + past.shape[2], after committing `past` (B, C, P, h, w)
    at frames start.. (and `sinks` at frames 0..S-1 when given), chunk by chunk as a session would."""
    cfg = dit.cfg
    attn = DenseSelfAttention(cfg, 1)
    F = cfg.frames_per_chunk
    t0 = torch.zeros(1, dtype=torch.float64)
    blocks = [] if sinks is None else [(0, sinks)]
    blocks += [(start + i, past[:, :, i:i + F]) for i in range(0, past.shape[2], F)]
    for off, lat in blocks:
        o = torch.tensor([off])
        attn.begin_chunk(o, lat.shape[2])
        attn.commit(dit(lat, t0, o, cross, attn, kv_only=True).kv, evict=False)
    o = torch.tensor([start + past.shape[2]])
    attn.begin_chunk(o, F)
    out = dit(x, torch.tensor([t], dtype=torch.float64), o, cross, attn).flow
    assert out is not None
    return out


def measure(shifts: tuple[int, ...] = (3, 21, 999, 99_999), dtype: torch.dtype = torch.float64) -> dict[str, float]:
    """Max abs difference of a rolled chunk's flow from the horizon's last chunk, per shift d (and with sinks)."""
    t, meta = fixture("self_forcing_rolling")
    dit = our_dit(t, our_config(meta, local_attn_size=-1)).to(dtype)  # every committed frame visible
    g = torch.Generator().manual_seed(0)
    C, h, w = meta["latent"]
    past = torch.randn(1, C, 18, h, w, generator=g, dtype=torch.float64).to(dtype)
    x = torch.randn(1, C, 3, h, w, generator=g, dtype=torch.float64).to(dtype)
    sinks = torch.randn(1, C, 3, h, w, generator=g, dtype=torch.float64).to(dtype)
    cross = dit.cross_kv(t["context.0"].to(dtype))
    tt = dit.cfg.timesteps[1]
    ref = chunk_at(dit, past, x, tt, cross, start=0)
    ref_sinks = chunk_at(dit, past[:, :, 3:], x, tt, cross, start=3, sinks=sinks)  # sinks adjacent: in training
    out = {}
    for d in shifts:
        out[f"rolled by {d} frames"] = float((chunk_at(dit, past, x, tt, cross, start=d) - ref).abs().max())
        far = chunk_at(dit, past[:, :, 3:], x, tt, cross, start=3 + d, sinks=sinks)
        out[f"with 3 sinks, rolled by {d} frames"] = float((far - ref_sinks).abs().max())
    out["flow magnitude (max abs)"] = float(ref.abs().max())
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    for dtype in (torch.float64, torch.float32):
        print(f"-- {dtype}")
        for k, v in measure(dtype=dtype).items():
            print(f"{k:>36}: {v:.3g}")


if __name__ == "__main__":
    main()
