"""TinyWorld 3 (`network3.py`, `model3.py`, `train3.py`): serving needs nothing of the simulator, the weights and
the starting images are checked on loading, training reads the camera's move from frames alone, and the model
runs the engine's contract (staged chunks, captures, the world memory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.models.tinyworld import layout, world
from worldcast.models.tinyworld.model import DEFAULT_WEIGHTS
from worldcast.models.tinyworld.model3 import TinyWorld3Model
from worldcast.models.tinyworld.network3 import TinyWorld3, TinyWorld3Config
from worldcast.models.tinyworld.train3 import measure_shifts, save_start_images, save_weights3

TINY = TinyWorld3Config(width=32, heads=2, layers=1, mlp_ratio=2, pixel_features=4, painter_width=8,
                        painter_blocks=1)


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random TinyWorld 3 weights and the starting images, as `train3.py` writes them."""
    folder = tmp_path_factory.mktemp("tw3")
    torch.manual_seed(0)
    path = folder / "tinyworld3.safetensors"
    save_weights3(path, TINY, TinyWorld3(TINY), torch.nn.functional.normalize(torch.randn(6, 384), dim=1))
    save_start_images(folder / "start", TINY.frame_size)
    return path


def test_serving_tinyworld3_imports_nothing_of_the_simulator(tiny_weights: Path) -> None:
    """Load through the registry and generate frames in a fresh interpreter: `world.py` is never imported."""
    code = f"""
import sys, numpy as np
from worldcast.models import registry
m = registry.load("tinyworld:3", weights={str(tiny_weights)!r})
from worldcast.engine.rollout import ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
cond = ScriptedConditioner(m.spec, context={{"prompt": np.ones(384, np.float32) / 384 ** 0.5}})
pool = StatePool(m.spec.states, budget_bytes=m.spec.state_bytes_per_session())
r = ChunkRollout("s", m, pool, cond, seed=0)
r.init(0.0)
run_chunk_batch([r])
bad = sorted(k for k in sys.modules if k.endswith("tinyworld.world") or k.endswith("tinyworld.train")
             or k.endswith("tinyworld.network"))
print("IMPORTED", bad)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True)
    assert "IMPORTED []" in out.stdout, out.stdout + out.stderr


def test_weights_of_another_network_and_missing_starting_images_are_refused(tiny_weights: Path,
                                                                            tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not TinyWorld 3's"):
        TinyWorld3Model.from_pretrained(DEFAULT_WEIGHTS)  # TinyWorld 2's file
    lone = tmp_path / "w.safetensors"
    lone.write_bytes(tiny_weights.read_bytes())
    with pytest.raises(FileNotFoundError, match="starting image .*meadow.png is missing"):
        TinyWorld3Model.from_pretrained(lone)
    with pytest.raises(FileNotFoundError, match="train3"):
        TinyWorld3Model.from_pretrained(tmp_path / "none.safetensors")


def test_training_reads_the_cameras_move_from_frames_and_finds_the_cuts() -> None:
    rng = np.random.default_rng(3)
    wm = world.WorldMap.generate(11)
    prev, cur, want = [], [], []
    for _ in range(12):
        a = world.random_actions(rng, 1)[0]
        st = world.WorldState(wm, "meadow", *(int(v) for v in rng.integers(0, 256, 2)))
        prev.append(world.render_view(wm, "meadow", st.x, st.y))
        cur.append(world.step(st, a))
        want.append(world.camera_step(a))
    prev.append(world.render_view(wm, "meadow", 5, 5))
    cur.append(world.render_view(wm, "lava", 7, 5))  # a prompt switch recoloured the world
    shifts, cuts = measure_shifts(np.stack(prev), np.stack(cur), 8)
    assert [tuple(s) for s in shifts[:12]] == want
    assert not cuts[:12].any() and cuts[12]


def _rollout(model: TinyWorld3Model, seed: int = 0) -> ChunkRollout:
    cond = ScriptedConditioner(model.spec, action=layout.action_vector({"d": True}),
                               context={"prompt": model.encode_prompt("a green meadow")})
    pool = StatePool(model.spec.states, budget_bytes=2 * model.spec.state_bytes_per_session())
    return ChunkRollout(f"tw3-{seed}", model, pool, cond, seed=seed)


def test_chunks_are_staged_until_commit_and_a_captured_session_continues_identically(tiny_weights: Path) -> None:
    from worldcast.engine.session_state import capture, parse, restore
    from worldcast.engine.step_scheduler import Phase, SessionSchedule

    m = TinyWorld3Model.from_pretrained(tiny_weights)
    r = _rollout(m)
    first = r.init(0.0)[0].image
    assert np.array_equal(first, m.start_images[layout.THEMES.index("meadow")]), "starts from the shipped image"
    cache = BatchCache()
    for _ in range(3):
        run_chunk_batch([r], cache)
    before = r.pool.snapshot(r.slot)
    r.begin_chunk(0.0, 0.05)
    for k in range(m.spec.denoising_steps):
        r.step(k)
    r.abort_chunk()
    after = r.pool.snapshot(r.slot)
    assert all(torch.equal(before[n][t], after[n][t]) for n in before for t in before[n])
    blob = capture(r, SessionSchedule(Phase.WAITING, 0, 0.0, 0.0, 0, 0, 0))
    twin = _rollout(m, seed=9)
    twin.slot = twin.pool.allocate("twin")
    restore(twin, parse(blob, m.spec))
    a = [f.image for _ in range(3) for f in run_chunk_batch([r], cache)]
    b = [f.image for _ in range(3) for f in run_chunk_batch([twin], BatchCache())]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(np.isfinite(x).all() for x in a)


def test_the_ablations_change_only_what_the_painter_paints_and_unknown_ones_are_refused(tiny_weights: Path) -> None:
    from worldcast.models.tinyworld import playtest

    m = TinyWorld3Model.from_pretrained(tiny_weights)
    with pytest.raises(ValueError, match="unknown ablation 'nope'"):
        with playtest.ablated(m, "nope"):
            pass
    acts = np.repeat(layout.action_vector({"d": True, "shift": True})[None], 6, 0)
    acts[0] = 0
    prompt = m.encode_prompt("a green meadow")
    base = playtest.served_rollout(m, 1, prompt, acts)
    for name in m.ABLATIONS:
        with playtest.ablated(m, name):
            ab = playtest.served_rollout(m, 1, prompt, acts)
        assert np.array_equal(ab[0], base[0])  # the same starting image
        assert not np.array_equal(ab[-1], base[-1]), f"{name}: the painted strips differ"
    assert m.net.ablate is None
