"""Parity (a): one chunk with no cache equals diffusers' WanTransformer3DModel; RoPE positions; commit pass."""

from __future__ import annotations

import pytest
import torch

from tests.models.causal_wan.refs import lifted_fp32_casts, max_err, ours_from, wan_reference
from worldcast.models.causal_wan.config import tiny
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import CausalWanDiT, rope_cos_sin, timestep_sinusoid
from worldcast.models.causal_wan.sampler import flow_to_x0, renoise

CFG = tiny(local_attn_size=-1, sink_size=0)
B, FN, H, W = 2, 3, 8, 8


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, CFG.in_channels, FN, H, W, generator=g, dtype=torch.float64)
    ctx = torch.randn(B, CFG.text_len, CFG.text_dim, generator=g, dtype=torch.float64)
    return x, ctx


def _ours_one_chunk(dit: CausalWanDiT, x: torch.Tensor, t: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
    attn = DenseSelfAttention(CFG, B)
    off = torch.zeros(B, dtype=torch.int64)
    attn.begin_chunk(off, FN)
    out = dit(x, t, off, dit.cross_kv(ctx), attn).flow
    assert out is not None
    return out


@pytest.mark.parametrize("t", [[1000.0, 937.5], [833.3333333333334, 0.0]])
def test_one_chunk_equals_wan_transformer_fp64(t: list[float]) -> None:
    ref = wan_reference(CFG, seed=1, lifted=True)
    dit = ours_from(ref, CFG)
    x, ctx = _inputs(2)
    tt = torch.tensor(t, dtype=torch.float64)
    with torch.no_grad(), lifted_fp32_casts():
        want = ref(x, tt, ctx).sample
    got = _ours_one_chunk(dit, x, tt, ctx)
    err = max_err(got, want)
    assert err <= 1e-9, f"max abs err {err:.3g} > 1e-9 vs WanTransformer3DModel (fp64, float32 casts lifted)"


def test_one_chunk_equals_wan_transformer_as_shipped() -> None:
    """Against the unmodified reference: its timestep sinusoid is float32, so at t ~ 1000 its argument
    carries up to 1000 * 2^-24 = 6e-5 of rounding; the tolerance is relative to the output's scale."""
    ref = wan_reference(CFG, seed=1, lifted=False)
    dit = ours_from(ref, CFG)
    x, ctx = _inputs(2)
    tt = torch.tensor([1000.0, 625.0], dtype=torch.float64)
    with torch.no_grad():
        want = ref(x, tt, ctx).sample
    got = _ours_one_chunk(dit, x, tt, ctx)
    err, scale = max_err(got, want), float(want.abs().max())
    assert err <= 2e-5 * scale, f"max abs err {err:.3g} > 2e-5 x {scale:.3g} (reference's float32 sinusoid)"


def test_sinusoid_matches_wan_formula_in_float64() -> None:
    t = torch.tensor([0.0, 625.0, 1000.0], dtype=torch.float64)
    emb = timestep_sinusoid(t, 8)
    half = torch.arange(4, dtype=torch.float64)
    arg = t[:, None] * 10000.0 ** (-half / 4)
    assert emb.dtype == torch.float64
    assert torch.equal(emb, torch.cat([arg.cos(), arg.sin()], 1))


def test_rope_positions_continue_without_a_table() -> None:
    """Attention scores depend only on relative frame positions, at offsets far past any 1024-entry table."""
    cfg = CFG
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2 * 16, cfg.heads, cfg.head_dim, generator=g, dtype=torch.float64)
    k = torch.randn_like(q)
    from worldcast.models.causal_wan.dit import apply_rope

    def scores(offset: int) -> torch.Tensor:
        pos = torch.tensor([[offset, offset + 7]], dtype=torch.int64)
        cos, sin = rope_cos_sin(pos, 4, 4, cfg, dtype=torch.float64)
        return torch.einsum("bnhd,bmhd->bhnm", apply_rope(q, cos, sin), apply_rope(k, cos, sin))

    base = scores(0)
    for off in (1023, 10**6):
        err = max_err(scores(off), base)
        assert err <= 1e-8, f"offset {off}: scores moved by {err:.3g} (> 1e-8): RoPE is not relative"
    cos, _ = rope_cos_sin(torch.tensor([[0, 1]]), 4, 4, cfg, dtype=torch.float64)
    assert not torch.equal(cos[:, :16], cos[:, 16:]), "frames at different positions must rotate differently"


def test_commit_pass_returns_the_full_pass_keys() -> None:
    """kv_only skips the last block's attention, cross-attention, FFN and head, not any key or value."""
    torch.manual_seed(0)
    dit = CausalWanDiT(CFG).double().eval()
    x, ctx = _inputs(3)
    off = torch.tensor([0, 3])
    t = torch.zeros(B, dtype=torch.float64)
    ckv = dit.cross_kv(ctx)
    runs = []
    for kv_only in (False, True):
        attn = DenseSelfAttention(CFG, B)
        attn.begin_chunk(off, FN)
        runs.append(dit(x, t, off, ckv, attn, kv_only=kv_only))
    full, commit = runs
    assert commit.flow is None and full.flow is not None
    for (k1, v1), (k2, v2) in zip(full.kv, commit.kv):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
        assert k1.shape == (B, FN * 16, CFG.heads, CFG.head_dim)


def test_flow_x0_and_renoise_invert() -> None:
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(2, 4, 3, 2, 2, generator=g, dtype=torch.float64), torch.randn(2, 4, 3, 2, 2, generator=g)
    t = torch.tensor([937.5, 625.0], dtype=torch.float64)
    x_t = renoise(x0, eps.double(), t)
    assert max_err(flow_to_x0(eps.double() - x0, x_t, t), x0) <= 1e-12
    tf = torch.tensor([[1000.0, 500.0, 0.0], [250.0, 250.0, 250.0]], dtype=torch.float64)  # per frame
    assert max_err(renoise(x0, eps.double(), tf)[0, :, 2], x0[0, :, 2]) == 0.0


def test_bf16_keeps_time_mlps_and_modulation_in_float32() -> None:
    dit = CausalWanDiT(CFG).cast(torch.bfloat16)
    assert dit.time_embedding[0].weight.dtype == torch.float32
    assert dit.blocks[0].modulation.dtype == torch.float32 and dit.head.modulation.dtype == torch.float32
    assert dit.blocks[0].self_attn.q.weight.dtype == torch.bfloat16
    attn = DenseSelfAttention(CFG, 1)
    off = torch.tensor([5])
    attn.begin_chunk(off, FN)
    x = torch.randn(1, CFG.in_channels, FN, H, W)
    out = dit(x, torch.tensor([937.5]), off, dit.cross_kv(torch.randn(1, 4, CFG.text_dim)), attn)
    assert out.flow is not None and out.flow.dtype == torch.bfloat16 and torch.isfinite(out.flow.float()).all()
