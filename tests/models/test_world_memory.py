"""TinyWorld's world memory (`models/tinyworld/memory.py`): walk away and come back, and the view is as it was.

Judged by the decoded frames of sessions run through the engine's rollout (the state pool, the model's
sampler) with the shipped weights; each exactness check has a control with the memory's recall turned off,
which must fail it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.session_state import capture, parse, restore
from worldcast.engine.state_pool import StatePool
from worldcast.models.tinyworld import memory, world
from worldcast.models.tinyworld.model import TinyWorldModel
from worldcast.models.tinyworld.network import TinyWorldConfig, TinyWorldDenoiser, marker_mask

MARKER = marker_mask(64).numpy()


def _act(**keys: bool) -> np.ndarray:
    return world.action_vector(dict(keys), (0.0, 0.0))


class _Session:
    """One session of `model` through the engine's rollout; `play` runs chunks with a given action."""

    def __init__(self, model: TinyWorldModel, prompt: str = "a green meadow", seed: int = 2_000_000) -> None:
        self.model = model
        self.action = np.zeros(world.ACTION_DIM, np.float32)
        self.cond = ScriptedConditioner(model.spec, action=lambda: self.action,
                                        context={"prompt": model.encode_prompt(prompt)})
        self.pool = StatePool(model.spec.states, budget_bytes=2 * model.spec.state_bytes_per_session(),
                              device=model.device)
        self.r = ChunkRollout(f"mem{seed}", model, self.pool, self.cond, seed=seed)
        self.cache = BatchCache()
        self.last = self.r.init(0.0)[0].image

    def play(self, action: np.ndarray, frames: int) -> np.ndarray:
        self.action = action
        for _ in range(frames):
            self.last = run_chunk_batch([self.r], self.cache)[0].image
        return self.last

    def prompt(self, text: str) -> None:
        self.cond.context = {"prompt": self.model.encode_prompt(text)}
        self.cond.context_version += 1

    def camera(self) -> list[int]:
        return self.pool.tensors["camera"]["data"][self.r.slot].tolist()


def _same_ground(a: np.ndarray, b: np.ndarray) -> float:
    """Share of the non-marker pixels equal in every channel."""
    eq = (a == b).all(-1)[~MARKER]
    return float(eq.mean())


@pytest.mark.parametrize(("out", "back", "frames"), [
    ({"d": True, "shift": True}, {"a": True, "shift": True}, 136),  # 8.5 views right and back
    ({"w": True}, {"s": True}, 40),
])
def test_walking_away_and_back_shows_the_ground_as_it_was(model: TinyWorldModel, out: dict[str, bool],
                                                          back: dict[str, bool], frames: int) -> None:
    s = _Session(model)
    before = s.play(_act(), 3).copy()
    s.play(_act(**out), frames)
    assert _same_ground(s.last, before) < 0.2  # the view has left the place
    after = s.play(_act(**back), frames)
    assert s.camera()[:2] == [0, 0]
    assert _same_ground(after, before) == 1.0

    control = _Session(model)  # the same walk with recall off: new ground is painted on return
    control.model.recall_memory = False
    try:
        control.play(_act(), 3)
        control.play(_act(**out), frames)
        forgot = control.play(_act(**back), frames)
    finally:
        control.model.recall_memory = True
    assert _same_ground(forgot, before) < 0.5


def test_a_square_walk_with_shift_and_a_diagonal_come_back_exactly(model: TinyWorldModel) -> None:
    s = _Session(model, prompt="a snowy landscape", seed=2_000_001)
    before = s.play(_act(), 2).copy()
    for keys in ({"d": True}, {"s": True}, {"a": True}, {"w": True}):
        s.play(_act(**keys, shift=True), 24)  # 96 px a side: the view leaves itself
    assert s.camera()[:2] == [0, 0]
    assert _same_ground(s.last, before) == 1.0
    s.play(_act(w=True, a=True), 40)
    s.play(_act(s=True, d=True), 40)
    assert _same_ground(s.last, before) == 1.0


def test_a_world_switch_starts_a_new_memory(model: TinyWorldModel) -> None:
    s = _Session(model)
    before = s.play(_act(), 2).copy()
    s.play(_act(d=True, shift=True), 24)
    s.prompt("molten lava")
    s.play(_act(), 3)
    assert s.camera()[2] == 1  # the cut began world 1
    after = s.play(_act(a=True, shift=True), 24)
    assert s.camera()[:2] == [0, 0]
    # the meadow is not recalled into the lava world: the ground returned to is the lava world's own
    assert _same_ground(after, before) < 0.05
    lava = world.PALETTES["lava"]
    assert np.abs(after.reshape(-1, 3).mean(0) - np.mean(lava[:2], axis=0)).sum() < \
        np.abs(before.reshape(-1, 3).mean(0) - np.mean(lava[:2], axis=0)).sum()


def test_memory_is_carried_by_a_captured_session(model: TinyWorldModel) -> None:
    s = _Session(model, seed=2_000_002)
    before = s.play(_act(), 2).copy()
    s.play(_act(d=True, shift=True), 40)
    blob = capture(s.r, _schedule())
    moved = _Session(model, seed=99)  # another pool and rollout, as another engine would have
    moved.r.close()
    moved.r.slot = moved.pool.allocate("moved")
    restore(moved.r, parse(blob, model.spec))
    assert torch.equal(moved.pool.tensors["memory"]["tag"][moved.r.slot], s.pool.tensors["memory"]["tag"][s.r.slot])
    after = moved.play(_act(a=True, shift=True), 40)
    assert _same_ground(after, before) == 1.0


def _schedule():  # type: ignore[no-untyped-def]
    from worldcast.engine.step_scheduler import Phase, SessionSchedule

    return SessionSchedule(phase=Phase.WAITING, step=0, deadline_s=0.0, start_at_s=0.0, frames=0, chunks=0,
                           late_frames=0)


def test_view_cells_wrap_and_tags_tell_wraps_and_worlds_apart() -> None:
    side = memory.memory_side(4)
    cam = torch.tensor([[0, 0, 0], [side, 0, 0], [-side, -side, 0], [0, 0, 1], [0, 0, memory.WORLD_CYCLE]])
    cells, tags = memory.view_cells(cam, 4, side)
    assert (cells == cells[0]).all()  # a canvas apart: the same cells
    assert len({tuple(t.tolist()) for t in tags[:4]}) == 4  # ... holding other ground
    assert torch.equal(tags[4], tags[0])  # world numbers cycle (module doc)
    assert (tags != 0).all()  # 0 is an empty cell, never a position's code
    c1, _ = memory.view_cells(torch.tensor([[side - 2, 0, 0]]), 4, side)
    assert c1[0, :4].tolist() == [side - 2, side - 1, 0, 1]  # a view across the canvas's edge wraps


def test_an_hour_of_walking_one_way_keeps_memory_fixed_and_working() -> None:
    """Many canvases' worth of walking at Shift speed on a tiny random TinyWorld: the pool's bytes never change,
    frames stay finite, and ground shown within the reach of the end point comes back exactly."""
    torch.manual_seed(0)
    cfg = TinyWorldConfig(frame_size=16, patch=8, width=32, heads=2, layers=1, mlp_ratio=2, pixel_features=4,
                          head_width=8)
    tiny = TinyWorldModel(cfg, TinyWorldDenoiser(cfg), torch.randn(len(world.THEMES), cfg.prompt_dim))
    s = _Session.__new__(_Session)
    s.model, s.action = tiny, np.zeros(world.ACTION_DIM, np.float32)
    s.cond = ScriptedConditioner(tiny.spec, action=lambda: s.action)
    s.pool = StatePool(tiny.spec.states, budget_bytes=tiny.spec.state_bytes_per_session(), device=tiny.device)
    s.r, s.cache = ChunkRollout("walker", tiny, s.pool, s.cond, seed=1), BatchCache()
    s.last = s.r.init(0.0)[0].image
    nbytes = sum(t.numel() * t.element_size() for ts in s.pool.tensors.values() for t in ts.values())
    side = memory.memory_side(16)
    frames = 5 * side // 4  # five canvases at 4 px a frame
    s.play(_act(d=True, shift=True), frames)
    assert s.camera()[0] == 4 * frames
    assert sum(t.numel() * t.element_size() for ts in s.pool.tensors.values() for t in ts.values()) == nbytes
    assert s.pool.tensors["memory"]["canvas"].shape == (1, side, side, 3)
    marker = marker_mask(16).numpy()
    here = s.play(_act(), 1).copy()
    s.play(_act(d=True, shift=True), 8)
    s.play(_act(a=True, shift=True), 8)
    assert (s.last == here).all(-1)[~marker].all()
