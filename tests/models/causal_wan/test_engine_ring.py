"""The engine's in-place ring attention (kernels/ring_attention.py over models/spec.py ring positions),
driven by this DiT, computes what the dense reference cache does: the two window rules are one rule."""

from __future__ import annotations

import torch

from tests.models.causal_wan.refs import max_err, randomize_
from worldcast.kernels.ring_attention import RingBatch, ring_attention
from worldcast.models.causal_wan.config import CausalWanConfig, tiny
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import KV, CausalWanDiT
from worldcast.models.spec import ring_position

H = W = 8
T = 16  # tokens per latent frame at 8x8 latents


class PoolAttention:
    """A one-slot pool laid out as AttentionRingSpec's tensors, written at ring_position (test adapter)."""

    def __init__(self, cfg: CausalWanConfig) -> None:
        self.cfg = cfg
        self.sinks, self.window = cfg.sink_size, cfg.kv_recent_frames
        P = self.sinks + self.window
        shape = (cfg.layers, 1, P * T, cfg.heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=torch.float64)
        self.v = torch.zeros(shape, dtype=torch.float64)
        self.ring_frame = torch.full((1, P), -1, dtype=torch.int64)
        self.c0 = 0

    def begin_chunk(self, c0: int, frames: int) -> None:
        self.c0, self.frames = c0, frames
        self.batch = RingBatch(
            ring_frame=self.ring_frame, slots=torch.tensor([0]), slots_host=(0,),
            q_frame=(c0 + torch.arange(frames))[None], tokens_per_frame=T, window=self.window, sinks=self.sinks,
        )  # fmt: skip

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.k[layer], self.v[layer], self.batch)

    def commit(self, kv: list[KV]) -> None:
        for f in range(self.frames):
            pos = ring_position(self.c0 + f, sink_frames=self.sinks, window_frames=self.window)
            for layer, (k, v) in enumerate(kv):
                self.k[layer, 0, pos * T : (pos + 1) * T] = k[0, f * T : (f + 1) * T]
                self.v[layer, 0, pos * T : (pos + 1) * T] = v[0, f * T : (f + 1) * T]
            self.ring_frame[0, pos] = self.c0 + f


def test_pool_ring_attention_equals_dense_reference() -> None:
    cfg = tiny(local_attn_size=12, sink_size=3)  # LongLive's rule: 3 sinks + 6 recent committed frames
    F = cfg.frames_per_chunk
    torch.manual_seed(0)
    dit = CausalWanDiT(cfg).double().eval()
    randomize_(dit, seed=41)
    g = torch.Generator().manual_seed(42)
    ckv = dit.cross_kv(torch.randn(1, cfg.text_len, cfg.text_dim, generator=g, dtype=torch.float64))
    dense, pool = DenseSelfAttention(cfg, 1), PoolAttention(cfg)
    for c in range(6):
        off = torch.tensor([c * F])
        dense.begin_chunk(off, F)
        pool.begin_chunk(c * F, F)
        x = torch.randn(1, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)
        t = torch.tensor([cfg.timesteps[c % 4]], dtype=torch.float64)
        a, b = dit(x, t, off, ckv, dense).flow, dit(x, t, off, ckv, pool).flow
        assert a is not None and b is not None
        err = max_err(a, b)
        assert err <= 1e-12, f"chunk {c}: engine ring attention differs from the dense reference by {err:.3g}"
        x0 = torch.randn(1, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)
        t0 = torch.zeros(1, dtype=torch.float64)
        kv_a = dit(x0, t0, off, ckv, dense, kv_only=True).kv
        kv_b = dit(x0, t0, off, ckv, pool, kv_only=True).kv
        assert all(max_err(ka, kb) <= 1e-12 for (ka, _), (kb, _) in zip(kv_a, kv_b))
        dense.commit(kv_a)
        pool.commit(kv_b)
