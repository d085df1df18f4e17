"""A third family the engine has never heard of (the FAKE `PaletteWorld`, tests/fake_models.py) runs through the
rollout with no special case: its image conditioning, its own action layout (init and chunks alike), causality
both ways, and transactional state."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fake_models import STEP, PaletteWorld
from worldcast.engine.rollout import ChunkRollout
from worldcast.engine.scripted import ScriptedConditioner, zero_context
from worldcast.engine.state_pool import StatePool
from worldcast.models.spec import ConditioningRequest


@pytest.fixture
def model() -> PaletteWorld:
    return PaletteWorld()


def rollout(model: PaletteWorld, keys_at: list[dict[str, bool]], *, rgb: tuple[int, int, int] = (200, 100, 50),
            seed: int = 0) -> tuple[ChunkRollout, list[dict[str, bool]]]:
    image = np.zeros((8, 8, 3), np.uint8) + np.array(rgb, np.uint8)
    ctx = model.encode_conditioning(ConditioningRequest(image=image))
    held: list[dict[str, bool]] = [{}]  # the keys held now (set before each chunk)
    cond = ScriptedConditioner(model.spec, context=ctx, action=lambda: model.encode_action(held[0], {}))
    pool = StatePool(model.spec.states, budget_bytes=model.spec.state_bytes_per_session())
    return ChunkRollout("s", model, pool, cond, seed=seed), held


def run(model: PaletteWorld, keys_at: list[dict[str, bool]], **kw) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    r, held = rollout(model, keys_at, **kw)
    r.init(0.0)
    frames = []
    for keys in keys_at:
        held[0] = keys
        r.begin_chunk(0.0, 0.0)
        for k in range(model.spec.denoising_steps):
            r.step(k)
        frames += [f.image for f in r.finalize(0.0)]
    return frames


def test_init_lays_actions_out_as_chunks_do(model: PaletteWorld) -> None:
    """Item 8: the per-pixel-frame vector is 4 wide, the model's per-latent-frame layout 2: init gets the latter."""
    assert model.spec.actions.dim == 4
    r, _ = rollout(model, [{}])
    r.init(0.0)
    assert model.init_action_shapes == [(1, 0, 2)]  # no initial latent frame, but the chunk width
    r.begin_chunk(0.0, 0.0)
    assert tuple(r.staged.action.shape) == (2, 2)  # type: ignore[union-attr]


def test_the_image_reaches_the_pixels_and_the_first_chunk_has_its_own_length(model: PaletteWorld) -> None:
    frames = run(model, [{}, {}], rgb=(200, 100, 50))
    assert len(frames) == 3 + 4  # latent frame 0 decodes to 1 pixel frame, later ones to 2
    assert np.abs(frames[0][0, 0].astype(int) - [200, 100, 50]).max() <= 1


def test_actions_change_the_frames_from_their_chunk_on_and_never_before(model: PaletteWorld) -> None:
    held, none = {"e": True}, {}
    a = run(model, [none, none, held, held], rgb=(100, 50, 25))
    b = run(model, [none, none, none, none], rgb=(100, 50, 25))
    first_changed = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if not np.array_equal(x, y))
    assert first_changed == 3 + 4  # the third chunk's first frame: not earlier (causal), not later (responsive)
    assert all(not np.array_equal(x, y) for x, y in zip(a[7:], b[7:], strict=True))
    brighter = a[-1][0, 0, 0].astype(int) - b[-1][0, 0, 0].astype(int)
    assert brighter == pytest.approx(100 * STEP * 4, abs=2)  # 4 latent frames under "e"


def test_an_aborted_chunk_leaves_the_declared_state_byte_identical(model: PaletteWorld) -> None:
    r, held = rollout(model, [{"e": True}] * 3)
    r.init(0.0)
    held[0] = {"e": True}
    before = r.pool.snapshot(r.slot)
    r.begin_chunk(0.0, 0.0)
    r.step(0)
    r.abort_chunk()
    after = r.pool.snapshot(r.slot)
    for name, tensors in before.items():
        for t, v in tensors.items():
            assert np.array_equal(v.numpy(), after[name][t].numpy()), f"{name}.{t} changed"


def test_zero_context_has_the_declared_shapes(model: PaletteWorld) -> None:
    ctx = zero_context(model.spec)
    model.spec.conditioning.check_encoded(ctx)
    with pytest.raises(ValueError, match="declares"):
        model.spec.conditioning.check_encoded({"image": np.zeros(4, np.float32)})
