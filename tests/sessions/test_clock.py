from worldcast.sessions.clock import VIDEO_TIME_BASE, MediaClock


def test_pts_on_90khz_clock_from_first_frame() -> None:
    c = MediaClock()
    assert c.pts(10.0) == 0
    assert c.pts(10.05) == 4500
    assert VIDEO_TIME_BASE.denominator == 90_000


def test_pts_strictly_increasing_even_if_times_repeat_or_go_back() -> None:
    c = MediaClock()
    out = [c.pts(t) for t in (1.0, 1.0, 0.5, 1.00001, 2.0)]
    assert all(b > a for a, b in zip(out, out[1:]))
