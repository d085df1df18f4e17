"""ChunkRollout: transactional chunks over the declared state, NaN isolation, parity with the offline path,
positions that never run out, no KV copies per step, bounded memory."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.fakes import ScriptedConditioner
from worldcast.engine.errors import StepFailed
from worldcast.engine.rollout import BatchCache, ChunkRollout, denoise_batch, finalize_batch
from worldcast.engine.scripted import ScriptedConditioner as EngineScripted
from worldcast.engine.state_pool import StatePool
from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.model import TinyWorldModel
from worldcast.models.tinyworld.network import TinyWorldConfig, TinyWorldDenoiser
from worldcast.models.tinyworld.rollout import iter_rollout


def make_pool(model, sessions: int = 4) -> StatePool:  # type: ignore[no-untyped-def]
    return StatePool(model.spec.states, budget_bytes=model.spec.state_bytes_per_session() * sessions)


def make_rollout(model, sid: str = "s", pool: StatePool | None = None, seed: int = 0, **cond):  # type: ignore[no-untyped-def]
    return ChunkRollout(sid, model, pool or make_pool(model), ScriptedConditioner(**cond), seed=seed)


def run_chunk(r: ChunkRollout, now: float = 0.0, cache: BatchCache | None = None) -> list:  # type: ignore[type-arg]
    r.begin_chunk(now, now + 0.05)
    for k in range(r.model.spec.denoising_steps):
        denoise_batch([r], [k], cache)
    return finalize_batch([r], now, cache=cache)


def state_of(r: ChunkRollout) -> dict[str, dict[str, torch.Tensor]]:
    return r.pool.snapshot(r.slot)


def assert_same_state(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> None:
    for name, ts in a.items():
        for t, x in ts.items():
            assert torch.equal(x, b[name][t]), f"state {name}.{t} changed"


def test_init_commits_the_initial_frame_as_latent_zero(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model)
    frames = r.init(1.0)
    assert len(frames) == 1 and frames[0].frame_index == 0 and frames[0].image.dtype == np.uint8
    assert frames[0].image.shape == (model.spec.frame_height, model.spec.frame_width, 3)
    st = state_of(r)
    assert st["kv"]["frame"].tolist() == [0, -1, -1, -1, -1] and r.next_latent == 1
    assert st["prev"]["data"].abs().sum() > 0, "the initial latent is the previous frame of frame 1"


def test_a_chunk_changes_nothing_until_it_commits(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model)
    r.init(0.0)
    before = state_of(r)
    r.begin_chunk(0.0, 0.05)
    for k in range(model.spec.denoising_steps):
        r.step(k)
        assert_same_state(before, state_of(r))
    frames = r.finalize(0.01)
    assert [f.frame_index for f in frames] == [1] and frames[0].present_at_s == 0.05
    assert set(frames[0].timings_ms) == {"queue", "denoise", "decode"}
    assert state_of(r)["kv"]["frame"].tolist()[:2] == [0, 1] and r.next_latent == 2


def test_frames_are_emitted_before_the_commit_forward(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pool = make_pool(model)
    a, b = make_rollout(model, "a", pool), make_rollout(model, "b", pool, seed=1)
    for r in (a, b):
        r.init(0.0)
        r.begin_chunk(0.0, 0.05)
        for k in range(model.spec.denoising_steps):
            r.step(k)
    log: list[str] = []
    real_commit = model.commit

    def commit(*args, **kw):  # type: ignore[no-untyped-def]
        log.append("commit")
        if len(log) == 2:  # the batched commit forward fails once the frames are out
            raise RuntimeError("injected commit failure")
        return real_commit(*args, **kw)

    monkeypatch.setattr(model, "commit", commit)
    before = [state_of(r) for r in (a, b)]
    with pytest.raises(RuntimeError, match="injected"):
        finalize_batch([a, b], 0.01, emit=lambda fs: log.append("emit " + ",".join(f.session_id for f in fs)))
    assert log == ["emit a,b", "commit"]
    for r, st in zip((a, b), before, strict=True):  # nothing applied: the chunk is still staged
        assert r.staged is not None and r.next_latent == 1
        assert_same_state(st, state_of(r))
    # re-run alone (as StepRunner does after a batch failure): committed, nothing decoded or emitted twice
    frames = finalize_batch([a], 0.02, emit=lambda fs: log.append("emit again"))
    assert log == ["emit a,b", "commit", "commit"] and [f.session_id for f in frames] == ["a"]
    assert a.staged is None and a.next_latent == 2 and b.staged is not None


def test_an_aborted_chunk_leaves_every_kind_of_state_byte_identical(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model, keys={"d": True})
    r.init(0.0)
    run_chunk(r)
    before = state_of(r)
    r.begin_chunk(0.0, 0.05)
    for k in range(model.spec.denoising_steps):
        r.step(k)
    r.abort_chunk()  # even after its last denoising step
    assert_same_state(before, state_of(r))
    assert r.staged is None and r.next_latent == 2
    assert set(before) == {"kv", "prev", "noise", "memory", "camera"}, "every state TinyWorld declares was compared"


def test_a_nan_chunk_fails_only_that_session_and_changes_nothing(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pool = make_pool(model)
    good, bad = make_rollout(model, "good", pool), make_rollout(model, "bad", pool, seed=1)
    for r in (good, bad):
        r.init(0.0)
        r.begin_chunk(0.0, 0.05)
    before = state_of(bad)
    real = model.denoise

    def poisoned(x_t, t, cond, state):  # type: ignore[no-untyped-def]
        out = real(x_t, t, cond, state)
        out[-1] = float("nan")  # the last session of the batch
        return out

    monkeypatch.setattr(model, "denoise", poisoned)
    cache = BatchCache()
    for k in range(model.spec.denoising_steps):
        denoise_batch([good, bad], [k, k], cache)  # no host sync per step: caught at the chunk's end
    emitted: list[str] = []
    with pytest.raises(StepFailed, match="bad"):
        finalize_batch([good, bad], 0.0, emit=lambda fs: emitted.extend(f.session_id for f in fs), cache=cache)
    assert emitted == [], "nothing is emitted from a batch with a non-finite chunk"
    assert_same_state(before, state_of(bad))
    monkeypatch.setattr(model, "denoise", real)
    assert [f.session_id for f in finalize_batch([good], 0.0, cache=cache)] == ["good"]  # the other carries on


def test_batched_and_single_rollouts_agree(model) -> None:  # type: ignore[no-untyped-def]
    pool = make_pool(model)
    a, b = make_rollout(model, "a", pool, seed=3, keys={"d": True}), make_rollout(model, "b", pool, seed=4)
    solo = make_rollout(model, "solo", pool, seed=3, keys={"d": True})
    for r in (a, b, solo):
        r.init(0.0)
    cache = BatchCache()
    for _ in range(3):
        for r in (a, b):
            r.begin_chunk(0.0, 0.05)
        for k in range(model.spec.denoising_steps):
            denoise_batch([a, b], [k, k], cache)
        fa = finalize_batch([a, b], 0.0, cache=cache)[0]
        fs = run_chunk(solo)[0]
        assert np.abs(fa.image.astype(int) - fs.image.astype(int)).max() <= 2
    torch.testing.assert_close(state_of(a)["prev"]["data"], state_of(solo)["prev"]["data"], atol=1e-4, rtol=1e-4)


def test_a_chunk_committed_in_another_batch_than_its_steps_draws_the_same(model) -> None:  # type: ignore[no-untyped-def]
    """TinyWorld's draw noise comes from the chunk's own initial noise (`ChunkConditioning.noise`), not from a batch's
    memo: steps batched with another session and the commit alone give the frames and state of a solo run."""
    pool = make_pool(model)
    a, b = make_rollout(model, "a", pool, seed=3, keys={"d": True}), make_rollout(model, "b", pool, seed=4)
    solo = make_rollout(model, "solo", pool, seed=3, keys={"d": True})
    for r in (a, b, solo):
        r.init(0.0)
    cache = BatchCache()
    for _ in range(12):  # well past the first strips: the carried noise matters
        for r in (a, b):
            r.begin_chunk(0.0, 0.05)
        for k in range(model.spec.denoising_steps):
            denoise_batch([a, b], [k, k], cache)
        fa = finalize_batch([a], 0.0, cache=cache)[0]  # a batch of its own, with its own memo
        finalize_batch([b], 0.0, cache=cache)
        fs = run_chunk(solo)[0]
        assert np.abs(fa.image.astype(int) - fs.image.astype(int)).max() <= 2
    torch.testing.assert_close(state_of(a)["noise"]["data"], state_of(solo)["noise"]["data"])
    assert state_of(a)["noise"]["data"].abs().sum() > 0, "the draw noise was carried"


def test_serving_computes_what_the_offline_rollout_computes(model) -> None:  # type: ignore[no-untyped-def]
    """The engine path (ring attention read in place from the pool) equals TinyWorld's offline rollout
    (explicit per-frame keys, dense bias), frame after frame, past the window. The offline rollout has no world
    memory, so the served side recalls none (the memory fills the ground the marker hid a frame before, which the
    network would paint: `tests/models/test_world_memory.py`)."""
    keys = {"d": True, "shift": True}
    seed, frames = 5, model.spec.state("kv").capacity_frames + 4
    r = make_rollout(model, keys=keys, seed=seed)
    r.init(0.0)
    z0 = r.pool.snapshot(r.slot)["prev"]["data"][None]
    model.recall_memory = False
    try:
        served = [run_chunk(r)[0] for _ in range(frames)]
    finally:
        model.recall_memory = True
    act = torch.from_numpy(world.action_vector(keys))[None]
    pro = torch.from_numpy(r.conditioner.context["prompt"])[None]
    g = torch.Generator().manual_seed(seed)
    offline = iter_rollout(model.net, z0, iter([act * 0] + [act] * frames), iter([pro] * (frames + 1)),
                           timesteps=model.spec.timesteps, generator=g)
    for i, (f, z) in enumerate(zip(served, offline, strict=True)):
        ref = model.decode_latents(z[:, None])[0, 0].numpy()
        diff = np.abs(f.image.astype(int) - ref.astype(int)).max()
        assert diff <= 1, f"frame {i + 1}: served and offline differ by {diff} levels"


def test_a_session_far_out_computes_what_it_computes_near_the_start(model) -> None:  # type: ignore[no-untyped-def]
    """Attention depends on frame ages only: the same window at latent frame ~100,000 gives the same frame."""
    pool = make_pool(model)
    near = make_rollout(model, "near", pool, seed=2, keys={"w": True})
    near.init(0.0)
    for _ in range(8):
        run_chunk(near)
    far = make_rollout(model, "far", pool, seed=2, keys={"w": True})
    far.init(0.0)
    shift = 100_000 - 100_000 % model.spec.state("kv").window_frames  # keeps every frame's ring position
    for name, ts in pool.snapshot(near.slot).items():
        for t, x in ts.items():
            if name == "kv" and t == "frame":
                x = torch.where(x >= model.spec.state("kv").sink_frames, x + shift, x)  # the sink stays frame 0
            pool.tensors[name][t][far.slot] = x
    far.next_latent = near.next_latent + shift
    far.generator.set_state(near.generator.get_state())
    a, b = run_chunk(near)[0], run_chunk(far)[0]
    assert b.frame_index == a.frame_index + shift
    assert np.array_equal(a.image, b.image)
    held = sorted(pool.snapshot(far.slot)["kv"]["frame"].tolist())
    assert held[0] == 0 and held[1:] == list(range(far.next_latent - 4, far.next_latent))


def _ring_heavy_model() -> TinyWorldModel:
    """A random-weight TinyWorld whose KV window dwarfs its activations (4 tokens a frame, 33 frames)."""
    torch.manual_seed(0)
    cfg = TinyWorldConfig(frame_size=16, window_frames=32, sink_frames=1, width=96, heads=3, layers=2)
    return TinyWorldModel(cfg, TinyWorldDenoiser(cfg), torch.randn(6, 384),
                          prompt_encoder=object())  # type: ignore[arg-type]


def _largest_allocation(fn) -> int:  # type: ignore[no-untyped-def]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)


def test_a_denoising_step_never_gathers_the_ring_of_every_layer() -> None:
    """The batch's ring is read as a view of the pool (contiguous slots) or gathered once per chunk, on its
    first pass; a later step allocates at most one layer's keys (its window plus the chunk's own keys, which
    TinyWorld's attention concatenates for one SDPA: measured faster than two-part attention over views,
    BENCHMARKS.md), never the whole ring."""
    m = _ring_heavy_model()
    pool = make_pool(m, 3)
    rs = [ChunkRollout(f"s{i}", m, pool, EngineScripted(m.spec), seed=i) for i in range(2)]
    cache = BatchCache()
    for r in rs:
        r.init(0.0)
    for _ in range(40):  # fill the window
        for r in rs:
            r.begin_chunk(0.0, 0.0)
        for k in range(m.spec.denoising_steps):
            denoise_batch(rs, [k, k], cache)
        finalize_batch(rs, 0.0, cache=cache)
    for r in rs:
        r.begin_chunk(0.0, 0.0)
    denoise_batch(rs, [0, 0], cache)  # the chunk's per-batch inputs (ring view, mask) are built on its first step
    ring = m.spec.state("kv")
    layer_bytes = (ring.capacity_tokens + ring.tokens_per_frame) * ring.heads * ring.head_dim * 4 * len(rs)
    whole_ring = ring.layers * ring.capacity_tokens * ring.heads * ring.head_dim * 4 * len(rs)
    # the step again, its per-chunk inputs built (TinyWorld's chunk has a single step: rerun it)
    biggest = _largest_allocation(lambda: denoise_batch(rs, [0, 0], cache))
    assert biggest <= layer_bytes, f"a step allocated {biggest} B at once; one layer's keys are {layer_bytes} B"
    assert layer_bytes < whole_ring
    # the same measurement sees a step that gathers the whole ring: a new chunk (fresh memo) of slots out of order
    for r in rs:
        r.begin_chunk(0.0, 0.0)
    swapped = [rs[1], rs[0]] if rs[0].slot < rs[1].slot else rs
    gathered = _largest_allocation(lambda: denoise_batch(swapped, [0, 0], cache))
    assert gathered >= whole_ring, "the check would not see a gather"


def test_live_tensors_stay_flat_over_an_unbounded_session(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model, keys={"w": True})
    cache = BatchCache()
    r.init(0.0)

    def live() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))

    for _ in range(20):
        run_chunk(r, cache=cache)
    start = live()
    for _ in range(120):
        run_chunk(r, cache=cache)
    assert live() <= start + 8, "tensors accumulate with session age"
