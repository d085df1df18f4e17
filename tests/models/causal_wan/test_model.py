"""CausalWanModel on the engine: the served rollout computes what the reference loop computes, frames fan out
9 then 12 per chunk, a prompt switch re-caches as its own transaction, batches equal solo runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.causal_wan.refs import randomize_
from worldcast.engine.errors import StatePoolExhausted
from worldcast.engine.rollout import BatchCache, ChunkRollout, denoise_batch, finalize_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.models.causal_wan.config import tiny
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.loading import tiny_parts
from worldcast.models.causal_wan.model import CausalWanModel
from worldcast.models.causal_wan.recache import recache_dense
from worldcast.models.causal_wan.sampler import x0_from_sigma
from worldcast.models.causal_wan.vae import frames_to_uint8
from worldcast.models.spec import ConditioningRequest


@pytest.fixture(scope="module")
def wan() -> CausalWanModel:
    parts = tiny_parts(cfg=tiny(local_attn_size=12, sink_size=3))  # LongLive's window: 3 sinks + 6 recent
    randomize_(parts.dit, seed=7, scale=0.2)  # zero-initialised heads would make the checks trivial
    return CausalWanModel(parts, name="causal-wan:tiny")


def prompt(m: CausalWanModel, text: str) -> dict[str, np.ndarray]:
    return m.encode_conditioning(ConditioningRequest(text=text))


def session(m: CausalWanModel, pool: StatePool, sid: str, *, seed: int, text: str = "a red fox") -> ChunkRollout:
    r = ChunkRollout(sid, m, pool, ScriptedConditioner(m.spec, context=prompt(m, text)), seed=seed)
    assert r.init(0.0) == [], "text-to-video starts from noise: no initial frames"
    return r


def chunk(rs: list[ChunkRollout], cache: BatchCache) -> list:  # type: ignore[type-arg]
    for r in rs:
        r.begin_chunk(0.0, 0.0)
    for k in range(rs[0].model.spec.denoising_steps):
        denoise_batch(rs, [k] * len(rs), cache)
    return finalize_batch(rs, 0.0, cache=cache)


def test_the_spec_declares_every_state_and_the_frame_fan_out(wan: CausalWanModel) -> None:
    s = wan.spec
    names = [st.name for st in s.states]
    assert names[:3] == ["kv", "cross", "latents"] and all(n.startswith("vae.") for n in names[3:])
    assert (s.chunk_pixel_frames(0), s.chunk_pixel_frames(3), s.chunk_pixel_frames(6)) == (9, 12, 12)
    assert s.timesteps == pytest.approx((1.0, 0.9375, 0.8333333, 0.625), abs=1e-6)
    kv = s.state("kv")
    assert (kv.sink_frames, kv.window_frames) == (3, 6)
    assert s.state_bytes_per_session() == sum(st.bytes_per_session() for st in s.states)


def test_served_rollout_equals_the_reference_loop(wan: CausalWanModel) -> None:
    """Engine (pool, in-place ring attention, staged decoder cache) vs the DiT driven by hand with a dense
    cache, the same noise draws (one session generator: chunk noise, then a fresh draw after every step)."""
    pool = StatePool(wan.spec.states, budget_bytes=wan.spec.state_bytes_per_session())
    seed, text = 11, "a lighthouse at dusk"
    r = session(wan, pool, "a", seed=seed, text=text)
    cache = BatchCache()
    served = [chunk([r], cache) for _ in range(5)]
    cfg, dit = wan.cfg, wan.dit
    g = torch.Generator().manual_seed(seed)
    cross = dit.cross_kv(torch.from_numpy(prompt(wan, text)["text"])[None])
    dense = DenseSelfAttention(cfg, 1)
    vae_cache = None
    ts = torch.tensor(cfg.timesteps, dtype=torch.float64)  # the time embedding's timesteps
    sig = torch.tensor([*cfg.flow_times, 0.0], dtype=torch.float32)  # the table's noise levels
    F = cfg.frames_per_chunk
    for c, frames in enumerate(served):
        off = torch.tensor([c * F])
        dense.begin_chunk(off, F)
        x = torch.randn((F, *wan.spec.latent_shape), generator=g)[None].permute(0, 2, 1, 3, 4)
        for i in range(len(cfg.flow_times)):
            x0 = x0_from_sigma(dit(x, ts[i].expand(1), off, cross, dense).flow, x, sig[i].expand(1))
            x = (1 - sig[i + 1]) * x0 + sig[i + 1] * torch.randn(
                (F, *wan.spec.latent_shape), generator=g)[None].permute(0, 2, 1, 3, 4)
        kv = dit(x0, torch.zeros(1), off, cross, dense, kv_only=True).kv
        dense.commit(kv)
        out, vae_cache = wan.vae.decode_chunk(x0, vae_cache, first_chunk=c == 0)
        ref = frames_to_uint8(out)[0].numpy()
        got = np.stack([f.image for f in frames])
        assert got.shape == ref.shape == ((9 if c == 0 else 12), 64, 64, 3)
        diff = np.abs(got.astype(int) - ref.astype(int)).max()
        assert diff <= 1, f"chunk {c}: served and reference frames differ by {diff} levels"
    assert [f.frame_index for f in served[1]] == list(range(9, 21))
    held = pool.snapshot(r.slot)["kv"]["frame"].tolist()
    assert sorted(held) == [0, 1, 2, 9, 10, 11, 12, 13, 14], "3 sinks + the last 6 committed latent frames"


def _dense_mirror(wan: CausalWanModel, snap: dict) -> tuple[DenseSelfAttention, dict[int, torch.Tensor]]:
    """The pool slot's ring as a dense cache (tokens in frame order) and its latents by frame."""
    T = wan.spec.state("kv").tokens_per_frame
    ring = snap["kv"]["frame"].tolist()
    order = sorted((f, p) for p, f in enumerate(ring) if f >= 0)
    dense = DenseSelfAttention(wan.cfg, 1)
    for layer in range(wan.cfg.layers):
        dense.k[layer] = torch.cat([snap["kv"]["k"][layer, p * T:(p + 1) * T] for _, p in order])[None]
        dense.v[layer] = torch.cat([snap["kv"]["v"][layer, p * T:(p + 1) * T] for _, p in order])[None]
    dense.frame = torch.tensor([f for f, _ in order]).repeat_interleave(T)[None]
    dense.valid = torch.ones_like(dense.frame, dtype=torch.bool)
    lat = {f: snap["latents"]["data"][p] for p, f in enumerate(snap["latents"]["frame"].tolist()) if f >= 0}
    return dense, lat


@pytest.mark.parametrize("chunks, written, sinks_rerun", [
    (4, {0, 1, 2, 6, 7, 8, 9, 10, 11}, True),  # switch at frame 12 <= 12: every frame re-run, the sinks too
    (6, {12, 13, 14, 15, 16, 17}, False),      # steady state: frames 9..17 re-run against the old sinks
])  # fmt: skip
def test_a_prompt_switch_recaches_as_longlive_in_its_own_transaction(wan: CausalWanModel, chunks: int,
                                                                     written: set[int], sinks_rerun: bool) -> None:
    pool = StatePool(wan.spec.states, budget_bytes=wan.spec.state_bytes_per_session())
    r = session(wan, pool, "a", seed=3)
    cache = BatchCache()
    for _ in range(chunks):
        chunk([r], cache)
    before = pool.snapshot(r.slot)
    new = prompt(wan, "a snowy mountain")
    cond: ScriptedConditioner = r.conditioner  # type: ignore[assignment]
    cond.context, cond.context_version = new, 1
    r.begin_chunk(0.0, 0.0)
    denoise_batch([r], [0], cache)  # the re-cache runs before the chunk's first step
    r.abort_chunk()  # ... and survives the chunk's abort: it was its own transaction
    after = pool.snapshot(r.slot)
    assert r.context_version == 1
    cross = wan.dit.cross_kv(torch.from_numpy(new["text"])[None])
    torch.testing.assert_close(after["cross"]["data"][0, 0], cross[0][0][0])
    frames = after["kv"]["frame"].tolist()
    T = wan.spec.state("kv").tokens_per_frame
    changed = {f for p, f in enumerate(frames)
               if not torch.equal(after["kv"]["k"][:, p * T:(p + 1) * T], before["kv"]["k"][:, p * T:(p + 1) * T])}
    assert changed == written
    assert ({0, 1, 2} <= changed) == sinks_rerun
    # ... and the rewritten keys and values are the dense reference re-cache's (recache.recache_dense)
    dense, lat = _dense_mirror(wan, before)
    recache_dense(wan.dit, dense, lat, cross, next_frame=chunks * wan.cfg.frames_per_chunk)
    for f in written:
        p = frames.index(f)
        sel = dense.frame[0] == f
        for layer in range(wan.cfg.layers):
            torch.testing.assert_close(after["kv"]["k"][layer, p * T:(p + 1) * T], dense.k[layer][0, sel],
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(after["kv"]["v"][layer, p * T:(p + 1) * T], dense.v[layer][0, sel],
                                       atol=1e-5, rtol=1e-5)


def test_a_batch_at_different_chunk_indices_equals_each_session_alone(wan: CausalWanModel) -> None:
    pool = StatePool(wan.spec.states, budget_bytes=wan.spec.state_bytes_per_session() * 4)
    old, solo_old = session(wan, pool, "old", seed=1), session(wan, pool, "solo_old", seed=1)
    cache = BatchCache()
    for _ in range(3):
        chunk([old], cache)
        chunk([solo_old], cache)
    new, solo_new = session(wan, pool, "new", seed=2, text="rain"), session(wan, pool, "solo_new", seed=2, text="rain")
    batched = chunk([old, new], cache)  # one session's first chunk (9 frames) beside a later one (12)
    alone = chunk([solo_old], cache) + chunk([solo_new], cache)
    assert [f.session_id for f in batched].count("new") == 9 and [f.session_id for f in batched].count("old") == 12
    for a, b in zip(batched, alone, strict=True):
        assert a.frame_index == b.frame_index
        assert np.abs(a.image.astype(int) - b.image.astype(int)).max() <= 1


def test_a_session_whose_whole_state_does_not_fit_is_refused(wan: CausalWanModel) -> None:
    pool = StatePool(wan.spec.states, budget_bytes=wan.spec.state_bytes_per_session() * 2 - 1)
    pool.allocate("a")
    with pytest.raises(StatePoolExhausted):
        pool.allocate("b")
    with pytest.raises(ValueError, match="unbounded global attention"):
        CausalWanModel(tiny_parts(cfg=tiny(local_attn_size=-1, sink_size=0)), name="global")
