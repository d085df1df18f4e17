"""MatrixGameModel on the engine: declared state, actions reach the pixels causally, batches equal solo runs,
an aborted chunk changes no state, the image conditions the video."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.matrix_game.tiny_model import rollout, run_chunk, script, session, tiny_model
from worldcast.engine.rollout import BatchCache, denoise_batch
from worldcast.engine.state_pool import StatePool
from worldcast.models.base import ChunkConditioning
from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.errors import ConditioningError
from worldcast.models.matrix_game.conditioning import ImageEncoders, fake_encoders
from worldcast.models.matrix_game.config import templerun, universal
from worldcast.models.matrix_game.controls import TEMPLERUN, UNIVERSAL
from worldcast.models.matrix_game.dit import MatrixGameDiT
from worldcast.models.matrix_game.loading import MatrixGameParts
from worldcast.models.matrix_game.model import MatrixGameModel
from worldcast.models.spec import ConditioningRequest

CHUNKS = 4


@pytest.fixture(scope="module")
def mg() -> MatrixGameModel:
    return tiny_model(seed=3)


def _full_size(cfg, controls) -> MatrixGameModel:  # type: ignore[no-untyped-def]
    with torch.device("meta"):
        parts = MatrixGameParts(cfg=cfg, dit=MatrixGameDiT(cfg).cast(torch.bfloat16), vae=WanVAEDecoder(cfg.vae),
                                encoders=fake_encoders())
    return MatrixGameModel(parts, controls=controls, name="matrix-game-2:full")


def test_matrix_full_size_spec_declares_every_cache_with_the_release_geometry() -> None:
    """Built on the meta device: the real universal model's declared state per session."""
    m = _full_size(universal(), UNIVERSAL)
    s = m.spec
    assert (s.frame_height, s.frame_width, s.fps, s.latent_shape) == (352, 640, 12, (16, 44, 80))
    assert (s.chunk_pixel_frames(0), s.chunk_pixel_frames(3)) == (9, 12)
    assert s.timesteps == pytest.approx((1.0, 0.908843, 0.713979), abs=1e-6) and s.commit_timestep == 0.0
    kv, mouse, kb = s.state("kv"), s.state("mouse_kv"), s.state("keyboard_kv")
    assert (kv.layers, kv.tokens_per_frame, kv.heads, kv.head_dim, kv.window_frames, kv.sink_frames) == \
        (30, 880, 12, 128, 3, 0)
    assert (mouse.layers, mouse.tokens_per_frame, mouse.heads, mouse.head_dim) == (15, 880, 16, 64)
    assert (kb.layers, kb.tokens_per_frame, kb.window_frames) == (15, 1, 3)
    assert s.state("cross").tensors()["data"][0] == (30, 2, 257, 12, 128)
    assert s.state("image_latent").tensors()["data"][0] == (30, 16, 44, 80)
    assert s.state("action_history").tensors()["data"][0] == (9, 6)
    assert kv.bytes_per_session() == 2 * 30 * 3 * 880 * 12 * 128 * 2 + 3 * 8  # 0.49 GB in bf16 + frame indices
    assert m.action_space.history_pixel_frames == 9 and m.conditioning.text is None
    t = _full_size(templerun(), TEMPLERUN)
    names = [st.name for st in t.spec.states]
    assert "mouse_kv" not in names and t.spec.actions.dim == 7 and t.spec.denoising_steps == 4


def _diverge(a: list[np.ndarray], b: list[np.ndarray]) -> list[bool]:
    return [not np.array_equal(x, y) for x, y in zip(a, b, strict=True)]


@pytest.mark.parametrize(("k", "first_changed"), [(13, 1), (20, 2)])
def test_matrix_actions_reach_the_pixels_causally(mg: MatrixGameModel, k: int, first_changed: int) -> None:
    """Same seed and image, two action scripts that differ from pixel frame k on: every chunk before the
    first latent frame that sees frame k is bit-identical, every chunk from it on differs.

    Latent frame j sees pixel frames [4j - 12, 4j): frame 13 (inside chunk 1, latent frames 3..5) first
    reaches latent frame 4, so chunk 1 changes; frame 20, chunk 1's last, first reaches latent frame 6,
    so chunk 1 stays identical and chunk 2 changes (the release's window, not an off-by-one here)."""
    P = 9 + 12 * (CHUNKS - 1)
    a = script(mg, P, seed=1)
    b = a.copy()
    b[k:] = script(mg, P - k, seed=2)
    assert not np.array_equal(a[k], b[k])
    ra, rb = rollout(mg, a, chunks=CHUNKS, seed=5), rollout(mg, b, chunks=CHUNKS, seed=5)
    changed = _diverge(ra, rb)
    assert changed == [c >= first_changed for c in range(CHUNKS)], f"chunks that changed: {changed}"


def test_matrix_the_image_conditions_the_video(mg: MatrixGameModel) -> None:
    rows = script(mg, 9 + 12, seed=4)
    other = np.full((mg.spec.frame_height, mg.spec.frame_width, 3), 30.0, np.float32)
    assert all(_diverge(rollout(mg, rows, chunks=2), rollout(mg, rows, chunks=2, image=other)))
    assert not any(_diverge(rollout(mg, rows, chunks=2), rollout(mg, rows, chunks=2)))


def test_matrix_a_batch_at_different_chunks_equals_each_session_alone(mg: MatrixGameModel) -> None:
    pool = StatePool(mg.spec.states, budget_bytes=mg.spec.state_bytes_per_session() * 4)
    P = 9 + 12 * 4
    ra, rb = script(mg, P, seed=7), script(mg, P, seed=8)
    img = np.full((mg.spec.frame_height, mg.spec.frame_width, 3), 200.0, np.float32)
    old, solo_old = session(mg, pool, "old", ra, seed=1), session(mg, pool, "solo_old", ra, seed=1)
    cache = BatchCache()
    for _ in range(2):
        run_chunk([old], cache)
        run_chunk([solo_old], cache)
    new = session(mg, pool, "new", rb, seed=2, image=img)
    solo_new = session(mg, pool, "solo_new", rb, seed=2, image=img)
    for _ in range(2):
        batched = run_chunk([old, new], cache)  # a first chunk (9 frames) beside a later one (12), then 12 + 12
        alone = run_chunk([solo_old], cache) + run_chunk([solo_new], cache)
        assert len(batched) == len(alone)
        for x, y in zip(batched, alone, strict=True):
            assert (x.session_id.removeprefix("solo_"), x.frame_index) == (y.session_id.removeprefix("solo_"),
                                                                          y.frame_index)
            assert np.abs(x.image.astype(int) - y.image.astype(int)).max() <= 1


def test_matrix_an_aborted_chunk_leaves_every_state_unchanged(mg: MatrixGameModel) -> None:
    """The action caches and history are committed and aborted with the rest."""
    pool = StatePool(mg.spec.states, budget_bytes=mg.spec.state_bytes_per_session())
    r = session(mg, pool, "a", script(mg, 9 + 12 * 3, seed=9), seed=4)
    cache = BatchCache()
    run_chunk([r], cache)
    before = pool.snapshot(r.slot)
    r.begin_chunk(0.0, 0.0)
    for k in range(mg.spec.denoising_steps):
        denoise_batch([r], [k], cache)
    r.abort_chunk()
    after = pool.snapshot(r.slot)
    for name, ts in before.items():
        for t, x in ts.items():
            assert torch.equal(x, after[name][t]), f"{name}.{t} changed by an aborted chunk"
    run_chunk([r], cache)
    done = pool.snapshot(r.slot)
    for name in ("kv", "mouse_kv", "keyboard_kv", "action_history"):
        assert not all(torch.equal(x, done[name][t]) for t, x in before[name].items()), f"{name} not committed"
    assert sorted(done["mouse_kv"]["frame"].tolist()) == [3, 4, 5]


def test_matrix_conditioning_is_an_image_and_refuses_text(mg: MatrixGameModel) -> None:
    H, W = mg.spec.frame_height, mg.spec.frame_width
    tall = np.zeros((300, 100, 3), np.uint8)
    tall[140:160] = 255  # a white band in the middle survives the centre crop
    out = mg.encode_conditioning(ConditioningRequest(image=tall))["image"]
    assert out.shape == (H, W, 3) and out.dtype == np.uint8 and out[H // 2].min() > 200 and out[0].max() == 0
    assert mg.encode_conditioning(ConditioningRequest())["image"].shape == (H, W, 3)  # the default picture
    with pytest.raises(ConditioningError, match="text"):
        mg.encode_conditioning(ConditioningRequest(text="a castle"))
    with pytest.raises(ConditioningError, match="image"):
        mg.encode_conditioning(ConditioningRequest(image=np.zeros((4, 4), np.float32)))


def test_matrix_encoders_with_wrong_shapes_are_refused_by_name(mg: MatrixGameModel) -> None:
    good = mg.encoders
    bad = ImageEncoders(first_frame=good.first_frame, clip=lambda im: torch.zeros(im.shape[0], 3, 1280), name="bad")
    m = MatrixGameModel(MatrixGameParts(cfg=mg.cfg, dit=mg.dit, vae=mg.vae, encoders=bad), controls=UNIVERSAL,
                        name="x")
    pool = StatePool(m.spec.states, budget_bytes=m.spec.state_bytes_per_session())
    view = pool.view((pool.allocate("a"),))
    cond = ChunkConditioning(action=torch.zeros(1, 0, 6), context={"image": torch.zeros(1, 32, 48, 3)},
                             frame_index=torch.zeros(1, 0, dtype=torch.int64))
    with pytest.raises(ValueError, match="bad: CLIP features"):
        m.init_state(torch.zeros(1, 0, 32, 48, 3, dtype=torch.uint8), cond, view)
    with pytest.raises(ValueError, match="controls give 7 keyboard"):
        MatrixGameModel(MatrixGameParts(cfg=mg.cfg, dit=mg.dit, vae=mg.vae, encoders=good), controls=TEMPLERUN,
                        name="x")


def test_matrix_action_caches_keep_no_sink_whatever_sink_size_says() -> None:
    """The release's action module attends to the last `local_attn_size` frames of its mouse and keyboard
    caches with `sink_size = 0` hard-coded (`wan/modules/action_module.py`); only self-attention keeps
    sinks. With a `sink_size` of 1 (no released config has one) the self-attention ring has 1 sink and a
    window of 2, the action rings no sink and a window of 3 (before issue 31 they took the sink too)."""
    from dataclasses import replace

    m = _full_size(replace(universal(), sink_size=1), UNIVERSAL)
    kv, mouse, kb = m.spec.state("kv"), m.spec.state("mouse_kv"), m.spec.state("keyboard_kv")
    assert (kv.sink_frames, kv.window_frames) == (1, 2)
    assert (mouse.sink_frames, mouse.window_frames) == (0, 3) and (kb.sink_frames, kb.window_frames) == (0, 3)
    assert m.cfg.action_window_frames == 3
