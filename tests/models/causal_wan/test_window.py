"""Parity (d): the rolling window with attention sinks, cached chunk by chunk with eviction, equals one
forward of the whole sequence under a dense token mask written here from the rule; global attention differs."""

from __future__ import annotations

import pytest
import torch

from tests.models.causal_wan.refs import max_err, randomize_
from worldcast.models.causal_wan.config import CausalWanConfig, tiny
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention, visible_key_frames
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.sampler import generate_chunk

H = W = 8
T = (H // 2) * (W // 2)  # tokens per latent frame


def dense_rollout_mask(frames: int, cfg: CausalWanConfig) -> torch.Tensor:
    """bool (frames*T, frames*T): query token of frame i sees key token of frame j. Written frame by frame
    from LongLive's rule: the chunk of i ends at e; keys are the first sink_size frames and the last
    local_attn_size - sink_size frames before e (all of them when local_attn_size = -1)."""
    F, L, S = cfg.frames_per_chunk, cfg.local_attn_size, cfg.sink_size
    allowed = torch.zeros(frames, frames, dtype=torch.bool)
    for i in range(frames):
        e = (i // F + 1) * F
        for j in range(frames):
            if j >= e:
                continue
            if L == -1 or j < S or j >= e - (L - S):
                allowed[i, j] = True
    return allowed.repeat_interleave(T, 0).repeat_interleave(T, 1)


class MaskedFullAttention:
    """`attend` for a whole sequence at once, under a fixed dense mask (the reference side)."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=self.mask
        )
        return y.transpose(1, 2)


def _rollout_vs_full(cfg: CausalWanConfig, chunks: int, *, seed: int) -> tuple[float, float, list[int]]:
    """(error vs the dense mask of cfg, error vs global attention, cached frames after each chunk)."""
    F, B = cfg.frames_per_chunk, 2
    torch.manual_seed(0)
    dit = CausalWanDiT(cfg).double().eval()
    randomize_(dit, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    ckv = dit.cross_kv(torch.randn(B, cfg.text_len, cfg.text_dim, generator=g, dtype=torch.float64))
    attn = DenseSelfAttention(cfg, B)
    clean, held = [], []
    for c in range(chunks - 1):
        noise = torch.randn(B, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)
        x0, _ = generate_chunk(dit, noise, ckv, attn, torch.full((B,), c * F), generator=g)
        clean.append(x0)
        held.append(max(attn.cached_frames()))
    off = torch.full((B,), (chunks - 1) * F)
    attn.begin_chunk(off, F)
    x = torch.randn(B, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)
    t = torch.full((B,), cfg.timesteps[1], dtype=torch.float64)
    ours = dit(x, t, off, ckv, attn).flow
    assert ours is not None

    frames = chunks * F
    seq = torch.cat([*clean, x], dim=2)
    per_frame = torch.cat([torch.zeros(B, frames - F, dtype=torch.float64), t[:, None].expand(B, F)], 1)
    zero = torch.zeros(B, dtype=torch.int64)
    outs = []
    for L in (cfg.local_attn_size, -1):
        mask = dense_rollout_mask(frames, tiny(local_attn_size=L, sink_size=cfg.sink_size if L != -1 else 0))
        full = dit(seq, per_frame, zero, ckv, MaskedFullAttention(mask)).flow
        assert full is not None
        outs.append(max_err(ours, full[:, :, -F:]))
    return outs[0], outs[1], held


def test_window_and_sinks_equal_the_dense_mask() -> None:
    cfg = tiny()  # local_attn_size 9, sink_size 3, chunks of 3: chunk 3 onwards no longer sees frames 3..5
    err, err_global, held = _rollout_vs_full(cfg, chunks=5, seed=11)
    assert err <= 1e-12, f"max abs err {err:.3g} > 1e-12 vs the dense window+sink mask (fp64, same modules)"
    assert err_global > 1e-3, "global attention must differ once the window is exceeded (control)"
    assert max(held) <= cfg.kv_cache_frames, f"cache held {held} frames, window needs {cfg.kv_cache_frames}"


@pytest.mark.parametrize("local, sink", [(6, 0), (12, 3), (-1, 0)])
def test_other_windows(local: int, sink: int) -> None:
    cfg = tiny(local_attn_size=local, sink_size=sink)
    err, _, _ = _rollout_vs_full(cfg, chunks=5, seed=13)
    assert err <= 1e-12, f"local {local} sink {sink}: max abs err {err:.3g} > 1e-12 vs the dense mask"


def test_visible_key_frames_matches_longlive_example() -> None:
    """LongLive 1.0 (window 12, sinks 3): the chunk of frames 12..14 sees 0..2 and 6..14."""
    frames = torch.arange(16)[None]
    vis = visible_key_frames(frames, torch.tensor([15]), local_attn_size=12, sink_size=3)[0]
    assert vis.nonzero().flatten().tolist() == [0, 1, 2, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    early = visible_key_frames(frames, torch.tensor([6]), local_attn_size=12, sink_size=3)[0]
    assert early.nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]
