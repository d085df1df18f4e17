"""A small random Matrix-Game model on the engine, and a conditioner that plays a per-pixel-frame action script."""

from __future__ import annotations

import numpy as np

from tests.models.matrix_game.tiny_weights import seeded_state
from worldcast.engine.rollout import BatchCache, ChunkInputs, ChunkRollout, denoise_batch, finalize_batch
from worldcast.engine.state_pool import StatePool
from worldcast.models.causal_wan.loading import load_state_strict
from worldcast.models.matrix_game.config import tiny
from worldcast.models.matrix_game.controls import UNIVERSAL, Controls
from worldcast.models.matrix_game.loading import expected_release_keys, release_state, tiny_parts
from worldcast.models.matrix_game.model import MatrixGameModel
from worldcast.models.spec import ConditioningRequest


def tiny_model(*, seed: int = 0, controls: Controls = UNIVERSAL, height: int = 32, width: int = 48,
               **overrides: object) -> MatrixGameModel:
    """`config.tiny()` at 32 x 48 pixels (6 tokens per latent frame), weights from `seeded_state`, fake encoders."""
    cfg = tiny(frame_height=height, frame_width=width, **overrides)  # type: ignore[arg-type]
    parts = tiny_parts(cfg=cfg, seed=seed)
    state = release_state(seeded_state(expected_release_keys(cfg), seed=seed + 100), cfg, what="tiny")
    load_state_strict(parts.dit, state, what="tiny")
    return MatrixGameModel(parts, controls=controls, name="matrix-game-2:tiny")


class ScriptConditioner:
    """A `Conditioner` that hands out the rows of a fixed (P, A) action script, pixel frame by pixel frame.

    The rollout's `init` samples once before the first chunk; that sample does not advance the script.
    """

    def __init__(self, rows: np.ndarray, image: np.ndarray) -> None:
        self.rows, self.image = rows.astype(np.float32), np.asarray(image, np.uint8)
        self.pos, self.started, self.context_version = 0, False, 0

    def sample_chunk(self, frames: int) -> ChunkInputs:
        if not self.started:
            self.started = True
            return ChunkInputs(actions=self.rows[:frames], context={"image": self.image}, action_seq=-1, epoch=0)
        out = self.rows[self.pos:self.pos + frames]
        assert out.shape[0] == frames, "the action script ran out"
        self.pos += frames
        return ChunkInputs(actions=out, context={"image": self.image}, action_seq=self.pos, epoch=0)

    def current_epoch(self) -> int:
        return 0

    def wants_frames(self) -> bool:
        return True

    def input_version(self) -> int:
        return 0


def session(model: MatrixGameModel, pool: StatePool, sid: str, rows: np.ndarray, *, seed: int,
            image: np.ndarray | None = None) -> ChunkRollout:
    img = model.encode_conditioning(ConditioningRequest())["image"] if image is None else image
    r = ChunkRollout(sid, model, pool, ScriptConditioner(rows, img), seed=seed)
    assert r.init(0.0) == [], "Matrix-Game generates latent frame 0 itself: no initial frames"
    return r


def run_chunk(rs: list[ChunkRollout], cache: BatchCache) -> list:  # type: ignore[type-arg]
    """One chunk of every rollout in one batch: its frames (FrameOut)."""
    for r in rs:
        r.begin_chunk(0.0, 0.0)
    for k in range(rs[0].model.spec.denoising_steps):
        denoise_batch(rs, [k] * len(rs), cache)
    return finalize_batch(rs, 0.0, cache=cache)


def rollout(model: MatrixGameModel, rows: np.ndarray, *, chunks: int, seed: int = 0,
            image: np.ndarray | None = None) -> list[np.ndarray]:
    """One session alone: per chunk its uint8 frames (F_pix, H, W, 3)."""
    pool = StatePool(model.spec.states, budget_bytes=model.spec.state_bytes_per_session())
    r = session(model, pool, "s", rows, seed=seed, image=image)
    cache = BatchCache()
    return [np.stack([f.image for f in run_chunk([r], cache)]) for _ in range(chunks)]


def script(model: MatrixGameModel, pixel_frames: int, *, seed: int) -> np.ndarray:
    """(P, A) random key presses and mouse moves through the model's own encode_action."""
    g = np.random.default_rng(seed)
    keys = model.controls.keys
    space = model.spec.actions
    rows = []
    for _ in range(pixel_frames):
        held = {k: bool(g.random() < 0.3) for k in keys}
        counts = (float(g.integers(-30, 30)), float(g.integers(-30, 30)))
        moves = {ax.name: c for ax, c in zip(space.mouse, counts) if ax is not None}
        rows.append(model.encode_action(held, space.axis_values(moves, {}, 1)))
    return np.stack(rows)
