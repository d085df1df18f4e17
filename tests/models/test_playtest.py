"""The play test's eyes (`picture.py`) and its verdicts (`playtest.py`): the simulator passes against itself, a
frozen or a flat world fails, and the camera shift read from pictures is the simulator's."""

import numpy as np
import pytest

from worldcast.models.tinyworld import picture, playtest, world


def _script(keys: dict[str, bool] | None = None, mouse: tuple[float, float] = (0.0, 0.0), frames: int = 80
            ) -> np.ndarray:
    a = np.repeat(world.action_vector(keys or {}, mouse)[None], frames + 1, 0)
    a[0] = 0
    return a


@pytest.mark.parametrize(("keys", "mouse", "expect"), [
    ({"d": True}, (0.0, 0.0), (2, 0)),
    ({"a": True, "shift": True}, (0.0, 0.0), (-4, 0)),
    ({"w": True}, (0.0, 0.0), (0, -2)),
    ({"s": True, "d": True}, (0.0, 0.0), (2, 2)),
    ({}, (3 * world.MOUSE_COUNTS_PER_PX, -2 * world.MOUSE_COUNTS_PER_PX), (3, -2)),
])
def test_camera_shift_reads_the_simulators_motion_from_pictures(keys, mouse, expect) -> None:  # type: ignore[no-untyped-def]
    for seed, theme in ((7, "meadow"), (8, "night"), (9, "snow")):
        sim = playtest.simulate_script(seed, theme, _script(keys, mouse))
        per_frame = playtest.shift_per_frame(sim, 20)
        assert tuple(per_frame) == expect, (seed, theme, per_frame)
        other = playtest.simulate_script(seed + 50, theme, _script(keys, mouse, frames=1))[0]
        moved, unrelated = picture.camera_shift(sim[30], sim[32])[1], picture.camera_shift(sim[30], other)[1]
        assert moved > unrelated, (moved, unrelated)  # the peak says how much the two frames share


def test_texture_and_objects_are_zero_on_a_flat_field_and_not_on_the_world() -> None:
    sim = playtest.simulate_script(3, "meadow", _script({"d": True}, frames=20))
    lo, hi, _ = (np.asarray(c) for c in world.PALETTES["meadow"])
    flat = np.broadcast_to(((lo + hi) // 2).astype(np.uint8), sim.shape)  # a field of the terrain's colour
    assert picture.texture(flat).max() == 0 and picture.object_share(flat, "meadow").max() == 0
    assert picture.texture(sim).min() > 1.0
    assert picture.object_share(sim, "meadow").mean() > 0.005
    with pytest.raises(KeyError):
        picture.object_share(sim, "mars")


def test_the_simulator_passes_against_itself_and_a_dead_world_fails() -> None:
    """The bars a served world is judged by: the simulator's own video passes; the same video frozen after its
    first frame (a world that stopped answering) and flattened (a world that went flat) fail."""
    rng = np.random.default_rng(4)
    n = 60 * playtest.FPS
    per_world: dict[str, dict[str, dict[str, dict[str, object]]]] = {"self": {}, "frozen": {}, "flat": {}}
    for i, theme in enumerate(("meadow", "night")):
        actions, segs = playtest.player_script(rng, n)
        sim = playtest.simulate_script(100 + i, theme, actions)
        frozen = np.broadcast_to(sim[:1], sim.shape)
        flat = np.broadcast_to(sim[:, :1, :1, :], sim.shape)
        lo, hi = n - playtest.WINDOW_S * playtest.FPS, n + 1
        for name, video in (("self", sim), ("frozen", frozen), ("flat", flat)):
            per_world[name][theme] = {"minute_1": playtest.window_stats(video, sim, theme, segs, lo, hi)}
    own = playtest.judge(per_world["self"], "minute_1")
    assert own["alive"] and own["answers_every_key"] and own["answered_share"] == 1.0
    assert own["held_input_seconds"] >= 10  # type: ignore[operator]
    for name in ("frozen", "flat"):
        verdict = playtest.judge(per_world[name], "minute_1")
        assert not verdict["answers_every_key"] and verdict["answered_share"] < 0.2, (name, verdict)
    assert not playtest.judge(per_world["flat"], "minute_1")["alive"]


def test_the_player_script_covers_every_frame_with_held_inputs() -> None:
    rng = np.random.default_rng(0)
    acts, segs = playtest.player_script(rng, 3000)
    assert acts.shape == (3001, world.ACTION_DIM) and not acts[0].any()
    assert segs[0].start == 1 and segs[-1].end == 3001
    assert all(a.end == b.start for a, b in zip(segs, segs[1:]))
    assert all(playtest.FPS <= s.end - s.start <= 3 * playtest.FPS for s in segs[:-1])
    for s in segs:
        assert (acts[s.start:s.end] == s.action).all()
    kinds = [s.kind for s in segs]
    assert {"still", "key", "pan"} <= set(kinds) and kinds.count("key") > kinds.count("pan")


def test_a_served_session_starts_on_the_simulators_view(model) -> None:  # type: ignore[no-untyped-def]
    """The play test's session is the engine's rollout of the shipped model: it opens on the simulator's view of
    its map seed (what the user sees first) and returns one frame per action."""
    actions = _script({"d": True}, frames=12)
    prompt = model.encode_prompt("a green meadow")
    frames = playtest.served_rollout(model, 11, prompt, actions)
    sim = playtest.simulate_script(11, model.theme_for(prompt), actions)
    assert frames.shape == sim.shape and frames.dtype == np.uint8
    assert np.array_equal(frames[0], sim[0])
    assert (frames[1:] != frames[0]).any()


def test_the_play_test_runs_at_least_a_minute(model) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="at least a minute"):
        playtest.play_worlds(model, minutes=0, seed=0)


def test_the_pictures_put_each_world_or_sequence_above_its_model_row(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`save_worlds` and evaluate's `save_strip` both draw through `save_pairs`: a PNG of 2 rows per world (or
    sequence), one column per time, the simulator's frame where asked (a frame's colour shows in its cell)."""
    from PIL import Image

    from worldcast.models.tinyworld.evaluate import save_strip

    red = np.zeros((3, 40, 64, 64, 3), np.uint8)
    red[..., 0] = 255
    videos = {"meadow": np.stack([red[0], red[1] // 2]), "snow": np.stack([red[0], red[1]])}
    playtest.save_worlds(tmp_path / "w.png", videos, [0, 1, 10])  # 10 s lies past the video: its last frame
    img = np.asarray(Image.open(tmp_path / "w.png").convert("RGB"))
    assert img.shape[:2] == (round(4 * 1.3 * 110), round(3 * 1.3 * 110))
    cell = img.shape[0] // 4
    assert img[cell // 2, img.shape[1] // 6, 0] > 200 and img[cell // 2, img.shape[1] // 6, 1] < 60  # sim: red
    assert 100 < img[cell + cell // 2, img.shape[1] // 6, 0] < 160  # the meadow's model: half red
    save_strip(tmp_path / "s.png", {"gt": red[:2, :33], "true": red[:2, :32]}, rows=2)
    assert np.asarray(Image.open(tmp_path / "s.png")).shape[:2] == (round(4 * 1.2 * 110), round(7 * 1.2 * 110))
