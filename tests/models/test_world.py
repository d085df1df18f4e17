import numpy as np
import pytest

from worldcast.models.tinyworld import world


def test_map_is_deterministic_per_seed() -> None:
    a, b, c = world.WorldMap.generate(7), world.WorldMap.generate(7), world.WorldMap.generate(8)
    assert np.array_equal(a.height, b.height) and np.array_equal(a.objects, b.objects)
    assert not np.array_equal(a.height, c.height)


def test_held_key_moves_camera_and_view_shifts_by_that_amount() -> None:
    m = world.WorldMap.generate(1)
    st = world.WorldState(m, "meadow", 10, 10)
    f0 = world.render_view(m, "meadow", st.x, st.y)
    f1 = world.step(st, world.action_vector({"d": True}))
    assert (st.x, st.y) == (10 + world.WALK_PX, 10)
    # content moves left by WALK_PX (the centre marker stays put, so compare away from it)
    assert np.array_equal(f1[:20, : 64 - world.WALK_PX], f0[:20, world.WALK_PX :])
    world.step(st, world.action_vector({"w": True, "shift": True}))
    assert (st.x, st.y) == (12, 10 - 2 * world.WALK_PX)


def test_mouse_pans_and_is_clipped() -> None:
    a = world.action_vector({}, (1000.0, -8.0))
    assert a[6] == 1.0 and a[7] == pytest.approx(-2 / world.MAX_PAN_PX)
    assert world.camera_step(a) == (world.MAX_PAN_PX, -2)


def test_world_wraps_so_positions_never_run_out() -> None:
    m = world.WorldMap.generate(2)
    assert np.array_equal(world.render_view(m, "snow", 5, 9), world.render_view(m, "snow", 5 + 256 * 1000, 9 - 256))


def test_themes_are_distinguishable_by_their_statistics() -> None:
    cents = world.theme_centroids()
    m = world.WorldMap.generate(123_456)
    for i, theme in enumerate(world.THEMES):
        for x in (0, 100, 200):
            assert world.classify_theme(world.render_view(m, theme, x, x), cents) == i


def test_space_lights_the_marker() -> None:
    m = world.WorldMap.generate(3)
    off, on = world.render_view(m, "night", 0, 0), world.render_view(m, "night", 0, 0, space=True)
    assert tuple(on[32, 32]) == (255, 215, 0) and tuple(off[32, 32]) == (255, 255, 255)


def test_random_actions_cover_moves_and_stills() -> None:
    a = world.random_actions(np.random.default_rng(0), 2000)
    moving = a[:, :4].sum(1) > 0
    assert 0.5 < moving.mean() < 0.9
    assert a.shape == (2000, world.ACTION_DIM) and a.dtype == np.float32
