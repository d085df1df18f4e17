"""ChunkRollout on the shipped model: transactional chunks, NaN detection, bounded memory."""

import numpy as np
import pytest
import torch

from tests.fakes import ScriptedConditioner
from worldcast.engine.errors import StepFailed
from worldcast.engine.kv_pool import KVPool
from worldcast.engine.rollout import ChunkRollout, denoise_batch, finalize_batch


def make_rollout(model, sid: str = "s", pool: KVPool | None = None, seed: int = 0, **cond):  # type: ignore[no-untyped-def]
    pool = pool or KVPool(model.spec.kv, budget_bytes=model.spec.kv.bytes_per_session() * 4)
    r = ChunkRollout(sid, model, pool, ScriptedConditioner(**cond), seed=seed)
    return r


def run_chunk(r: ChunkRollout, now: float = 0.0) -> list:  # type: ignore[type-arg]
    r.begin_chunk(now, now + 0.05)
    for _ in range(r.model.spec.denoising_steps):
        r.step()
    return r.finalize(now)


def state_of(r: ChunkRollout) -> tuple:  # type: ignore[type-arg]
    k, v, fi = r.pool.snapshot(r.slot)
    return k, v, fi, r.prev.clone(), r.next_frame


def test_init_commits_the_first_frame_and_emits_it(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model)
    frames = r.init(1.0)
    assert len(frames) == 1 and frames[0].frame_index == 0 and frames[0].image.dtype == np.uint8
    assert frames[0].image.shape == (model.spec.frame_height, model.spec.frame_width, 3)
    assert r.next_frame == 1 and r.pool.view([r.slot]).k_valid.sum() == model.spec.kv.tokens_per_frame


def test_chunk_emits_frames_only_at_commit(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model)
    r.init(0.0)
    r.begin_chunk(0.0, 0.05)
    r.step()
    assert r.staged is not None and r.next_frame == 1  # nothing committed mid-chunk
    r.step()
    frames = r.finalize(0.01)
    assert [f.frame_index for f in frames] == [1] and frames[0].present_at_s == 0.05
    assert set(frames[0].timings_ms) == {"queue", "denoise", "decode"}


def test_frames_are_emitted_before_the_commit_forward(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pool = KVPool(model.spec.kv, budget_bytes=model.spec.kv.bytes_per_session() * 4)
    a, b = make_rollout(model, "a", pool), make_rollout(model, "b", pool, seed=1)
    for r in (a, b):
        r.init(0.0)
        r.begin_chunk(0.0, 0.05)
        r.step()
        r.step()
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
        assert r.staged is not None and r.next_frame == st[4] and torch.equal(r.pool.snapshot(r.slot)[0], st[0])
    # re-run alone (as StepRunner does after a batch failure): committed, nothing decoded or emitted twice
    frames = finalize_batch([a], 0.02, emit=lambda fs: log.append("emit again"))
    assert log == ["emit a,b", "commit", "commit"] and [f.session_id for f in frames] == ["a"]
    assert a.staged is None and a.next_frame == 2 and b.staged is not None


def test_aborted_chunk_leaves_session_byte_identical(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model)
    r.init(0.0)
    run_chunk(r)
    before = state_of(r)
    r.begin_chunk(0.0, 0.05)
    r.step()
    r.abort_chunk()
    after = state_of(r)
    for a, b in zip(before[:4], after[:4], strict=True):
        assert torch.equal(a, b)
    assert before[4] == after[4] and r.staged is None


def test_nan_step_fails_only_that_session_and_changes_nothing(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pool = KVPool(model.spec.kv, budget_bytes=model.spec.kv.bytes_per_session() * 4)
    good, bad = make_rollout(model, "good", pool), make_rollout(model, "bad", pool, seed=1)
    for r in (good, bad):
        r.init(0.0)
        r.begin_chunk(0.0, 0.05)
    before = state_of(bad)
    real = model.denoise

    def poisoned(x_t, prev, t, cond, cache):  # type: ignore[no-untyped-def]
        out = real(x_t, prev, t, cond, cache)
        out[-1] = float("nan")  # the last session of the batch
        return out

    monkeypatch.setattr(model, "denoise", poisoned)
    with pytest.raises(StepFailed, match="bad"):
        denoise_batch([good, bad])
    monkeypatch.setattr(model, "denoise", real)
    assert good.staged.step == 0 and bad.staged.step == 0  # nothing advanced
    denoise_batch([good])  # the other session carries on alone
    assert good.staged.step == 1
    for a, b in zip(before[:4], state_of(bad)[:4], strict=True):
        assert torch.equal(a, b)


def test_batched_and_single_rollouts_agree(model) -> None:  # type: ignore[no-untyped-def]
    pool = KVPool(model.spec.kv, budget_bytes=model.spec.kv.bytes_per_session() * 4)
    a, b = make_rollout(model, "a", pool, seed=3, keys={"d": True}), make_rollout(model, "b", pool, seed=4)
    solo = make_rollout(model, "solo", pool, seed=3, keys={"d": True})
    for r in (a, b, solo):
        r.init(0.0)
    for _ in range(3):
        for r in (a, b):
            r.begin_chunk(0.0, 0.05)
        for _ in range(model.spec.denoising_steps):
            denoise_batch([a, b])
        fa = finalize_batch([a, b], 0.0)[0]
        fs = run_chunk(solo)[0]
        assert np.abs(fa.image.astype(int) - fs.image.astype(int)).max() <= 2


def test_unbounded_session_keeps_memory_constant_past_100k_frames(model) -> None:  # type: ignore[no-untyped-def]
    r = make_rollout(model, keys={"w": True})
    r.init(0.0)
    pool = r.pool
    ptr, nbytes = pool.k.data_ptr(), pool.k.nbytes + pool.v.nbytes
    window = model.spec.kv.window_frames
    for _ in range(10 * window + 2):
        run_chunk(r)
    r.next_frame = 100_003  # jump the position counter far ahead
    for _ in range(2 * window):
        frames = run_chunk(r)
        assert np.isfinite(r.prev.numpy()).all()
    assert frames[-1].frame_index == 100_003 + 2 * window - 1
    assert pool.k.data_ptr() == ptr and pool.k.nbytes + pool.v.nbytes == nbytes
    held = sorted(pool.snapshot(r.slot)[2].tolist())
    assert held == [0] + list(range(100_003 + window, 100_003 + 2 * window))
