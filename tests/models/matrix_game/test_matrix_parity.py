"""Parity with the release's own code: our served path against fixtures from Matrix-Game 2.0's pipeline.

Reference: SkyworkAI/Matrix-Game, `Matrix-Game-2/pipeline/causal_inference.py` `CausalInferencePipeline`
over its `CausalWanModel` and `ActionModule`, run in float64 with seeded tiny weights by
`make_fixtures.py` (commit in each fixture's metadata; stubs listed there). Our side runs the
engine's real `StatePool`: ring attention read in place, the action caches and history as declared
state, the image conditioning through the model's own `init_state`.
"""

from __future__ import annotations

import re

import pytest

from tests.models.matrix_game.release_fixture import NAMES, build_model, load, ring_frames, run_ours
from worldcast.models.matrix_game.loading import expected_release_keys

#: float64 on both sides (measured: <= 3e-15 of x0); the differences are summation order
TOL = 1e-12


@pytest.fixture(scope="module", params=NAMES)
def case(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    fx = load(request.param)
    model = build_model(fx)
    return fx, model, run_ours(model, fx)


@pytest.mark.parametrize("name", NAMES)
def test_matrix_fixture_names_its_reference_and_the_release_keys(name: str) -> None:
    """The fixture records the reference commit, and the release model's own state-dict keys are exactly
    the ones our key table expects for that config (nothing missing, nothing extra, same shapes)."""
    fx = load(name)
    assert re.fullmatch(r"[0-9a-f]{40}", fx.meta["reference_commit"]), fx.meta["reference_commit"]
    assert "SkyworkAI/Matrix-Game" in fx.meta["reference"]
    assert expected_release_keys(fx.our_config()) == fx.keys


def test_matrix_every_denoising_step_matches_the_release_fp64(case) -> None:  # type: ignore[no-untyped-def]
    fx, _, ours = case
    assert len(ours.x0) == fx.chunks * fx.steps
    for n, got in enumerate(ours.x0):
        want = fx.tensors[f"call.{n}.x0"]
        err, scale = float((got - want).abs().max()), float(want.abs().max())
        assert err <= TOL * scale, (f"{fx.name} chunk {n // fx.steps} step {n % fx.steps}: x0 differs by {err:.3g} "
                                    f"(> {TOL:g} x {scale:.3g}) from the release's pipeline")


def test_matrix_caches_after_the_rollout_match_the_release_fp64(case) -> None:  # type: ignore[no-untyped-def]
    """Self-attention, mouse and keyboard keys/values of the newest committed frames, every block."""
    fx, model, ours = case
    cfg = model.cfg
    window = cfg.window_frames
    last = fx.run["latent_frames"]
    frames = list(range(last - window, last))
    T = cfg.tokens_per_frame()
    checked = 0
    for i in range(cfg.layers):
        k, v = ring_frames(ours.pool, ours.slot, "kv", i, frames)
        for got, key in ((k, "k"), (v, "v")):
            want = fx.tensors[f"cache.kv.{i}.{key}"][0]  # (window * T, H, hd)
            assert float((got - want).abs().max()) <= TOL * float(want.abs().max()), f"block {i} self-attn {key}"
            checked += 1
        if i not in model.dit.action_blocks:
            continue
        a = model.dit.action_blocks.index(i)
        k, v = ring_frames(ours.pool, ours.slot, "keyboard_kv", a, frames)
        for got, key in ((k, "k"), (v, "v")):
            want = fx.tensors[f"cache.keyboard.{i}.{key}"][0]  # (window, H, d)
            assert float((got - want).abs().max()) <= TOL * float(want.abs().max()), f"block {i} keyboard {key}"
            checked += 1
        if cfg.action is not None and cfg.action.enable_mouse:
            k, v = ring_frames(ours.pool, ours.slot, "mouse_kv", a, frames)  # (window * T, H, d) frame-major
            for got, key in ((k, "k"), (v, "v")):
                want = fx.tensors[f"cache.mouse.{i}.{key}"]  # (T, window, H, d): per token, frames
                got_t = got.view(window, T, *got.shape[1:]).transpose(0, 1)
                assert float((got_t - want).abs().max()) <= TOL * float(want.abs().max()), f"block {i} mouse {key}"
                checked += 1
    assert checked >= 2 * cfg.layers + 2 * len(model.dit.action_blocks)


def test_matrix_control_other_actions_do_not_match(case) -> None:  # type: ignore[no-untyped-def]
    """The comparison can fail: the same rollout with the actions of the pixel frames reversed differs."""
    fx, model, _ = case
    flipped = run_ours(model, fx, rows=fx.pixel_actions().flip(0))
    diffs = [float((g - fx.tensors[f"call.{n}.x0"]).abs().max()) for n, g in enumerate(flipped.x0)]
    assert max(diffs) > 1e-3, f"reversed actions changed nothing (max {max(diffs):.3g}): actions are not used"
