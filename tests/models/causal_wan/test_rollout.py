"""Parity (b): the cached chunk-by-chunk rollout equals one block-causal forward of diffusers'
SkyReelsV2Transformer3DModel; (e): a batch of sessions at different chunks equals each alone."""

from __future__ import annotations

import torch

from tests.models.causal_wan.refs import lifted_fp32_casts, max_err, ours_from, randomize_, skyreels_reference
from worldcast.models.causal_wan.config import tiny
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.sampler import flow_to_x0, generate_chunk, renoise

H = W = 8
TOL = 1e-9  # fp64 with the reference's float32 casts lifted (see refs.py); measured ~1e-13


def test_cached_rollout_equals_block_causal_full_forward() -> None:
    cfg = tiny(local_attn_size=-1, sink_size=0)
    F, B, chunks = cfg.frames_per_chunk, 2, 3
    ref = skyreels_reference(cfg, seed=4, frames_per_block=F)
    dit = ours_from(ref, cfg)
    g = torch.Generator().manual_seed(5)
    ctx = torch.randn(B, cfg.text_len, cfg.text_dim, generator=g, dtype=torch.float64)
    ckv = dit.cross_kv(ctx)
    attn = DenseSelfAttention(cfg, B)

    # earlier chunks: Self-Forcing's loop (4 steps, fresh noise between them, commit pass at t = 0)
    clean = []
    for c in range(chunks - 1):
        noise = torch.randn(B, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)
        x0, _ = generate_chunk(dit, noise, ckv, attn, torch.full((B,), c * F), generator=g)
        clean.append(x0)

    # the last chunk, at each of its denoising steps, against one full forward of the whole sequence
    off = torch.full((B,), (chunks - 1) * F)
    attn.begin_chunk(off, F)
    x = torch.randn(B, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)
    bidir = skyreels_reference(cfg, seed=4, frames_per_block=1)  # control: no mask at all
    bidir.load_state_dict(ref.state_dict())
    ts = cfg.timesteps
    for i, t in enumerate(ts):
        tt = torch.full((B,), t, dtype=torch.float64)
        ours = dit(x, tt, off, ckv, attn).flow
        assert ours is not None
        seq = torch.cat([*clean, x], dim=2)  # (B, C, chunks*F, H, W)
        per_frame = torch.full((B, chunks * F), t, dtype=torch.float64)
        per_frame[:, : (chunks - 1) * F] = 0.0  # earlier chunks clean, the last at its timestep
        with torch.no_grad(), lifted_fp32_casts():
            want = ref(seq, per_frame, ctx, enable_diffusion_forcing=True).sample[:, :, -F:]
            other = bidir(seq, per_frame, ctx, enable_diffusion_forcing=True).sample[:, :, -F:]
        err = max_err(ours, want)
        assert err <= TOL, f"step {i} (t={t}): max abs err {err:.3g} > {TOL} vs block-causal SkyReelsV2"
        assert max_err(ours, other) > 1e-3, "the bidirectional control must differ (the test could not fail)"
        x0 = flow_to_x0(ours, x, tt)
        if i + 1 < len(ts):
            fresh = torch.randn(x.shape, generator=g, dtype=torch.float64)
            x = renoise(x0, fresh, torch.full((B,), ts[i + 1], dtype=torch.float64))


def test_batch_of_sessions_equals_each_alone() -> None:
    """Sessions at chunk 0, 1 and 4 (the last past the window, with frames evicted), different prompts,
    timesteps and frame offsets, in one forward: same flow and keys as each run alone."""
    cfg = tiny()  # window 9 latent frames, 3 sinks
    F = cfg.frames_per_chunk
    torch.manual_seed(0)
    dit = CausalWanDiT(cfg).double().eval()
    randomize_(dit, seed=7)
    g = torch.Generator().manual_seed(8)
    histories = [0, 1, 4]
    states, ckvs, ctxs = [], [], []
    for n in histories:
        ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g, dtype=torch.float64)
        ckv = dit.cross_kv(ctx)
        st = DenseSelfAttention(cfg, 1)
        for c in range(n):
            noise = torch.randn(1, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)
            generate_chunk(dit, noise, ckv, st, torch.tensor([c * F]), generator=g)
        states.append(st)
        ckvs.append(ckv)
        ctxs.append(ctx)
    assert states[2].cached_frames()[0] == cfg.kv_cache_frames < 4 * F  # eviction happened

    offs = torch.tensor([n * F for n in histories])
    ts = torch.tensor([1000.0, 833.3333333333334, 625.0], dtype=torch.float64)
    x = torch.randn(3, cfg.in_channels, F, H, W, generator=g, dtype=torch.float64)

    alone = []
    for i, st in enumerate(states):
        st.begin_chunk(offs[i : i + 1], F)
        alone.append(dit(x[i : i + 1], ts[i : i + 1], offs[i : i + 1], ckvs[i], st))

    batch = DenseSelfAttention.stack(states)
    batch.begin_chunk(offs, F)
    ckv_b = [(torch.cat([c[lay][0] for c in ckvs]), torch.cat([c[lay][1] for c in ckvs])) for lay in range(cfg.layers)]
    out = dit(x, ts, offs, ckv_b, batch)
    assert out.flow is not None
    for i, a in enumerate(alone):
        assert a.flow is not None
        err = max_err(out.flow[i : i + 1], a.flow)
        assert err <= 1e-12, f"session {i}: batched flow differs from alone by {err:.3g} (> 1e-12)"
        for (kb, vb), (ka, va) in zip(out.kv, a.kv):
            assert max_err(kb[i : i + 1], ka) <= 1e-12 and max_err(vb[i : i + 1], va) <= 1e-12
    # the sessions really are different: swapping two sessions' states changes the result
    swapped = DenseSelfAttention.stack([states[1], states[0], states[2]])
    swapped.begin_chunk(offs, F)
    other = dit(x, ts, offs, ckv_b, swapped).flow
    assert other is not None and max_err(other[1:2], out.flow[1:2]) > 1e-3
