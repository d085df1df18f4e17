"""Stream measurements against values computed by hand (30 frames/s on the 90 kHz clock throughout)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from worldcast.latency_bench.stats import (
    ViewerResult,
    inter_frame_intervals_ms,
    interarrival_jitter_ms,
    percentiles,
    real_time_factor,
    simulate_viewer,
    slo_attained,
)

FPS = 30
TICKS = 90_000 // FPS  # 3000 ticks = 33.33 ms per frame


def paced(n: int, *, t0_s: float = 0.0) -> tuple[list[float], list[int]]:
    """n frames arriving exactly at their PTS cadence."""
    return [t0_s + k / FPS for k in range(n)], [k * TICKS for k in range(n)]


def test_percentiles() -> None:
    assert percentiles([5, 1, 4, 2, 3]) == pytest.approx({"p50": 3.0, "p95": 4.8, "p99": 4.96})  # 1 + q/100 * 4
    assert percentiles(np.arange(101.0), qs=(0, 99.9)) == pytest.approx({"p0": 0.0, "p99.9": 99.9})
    empty = percentiles([])
    assert list(empty) == ["p50", "p95", "p99"] and all(math.isnan(v) for v in empty.values())


def test_inter_frame_intervals() -> None:
    np.testing.assert_allclose(inter_frame_intervals_ms([1.0, 1.033, 1.1, 1.1]), [33.0, 67.0, 0.0], atol=1e-9)
    assert inter_frame_intervals_ms([2.0]).shape == (0,)
    assert inter_frame_intervals_ms([]).shape == (0,)


def test_jitter_of_paced_or_uniformly_delayed_frames_is_zero() -> None:
    arrival, pts = paced(50)
    assert interarrival_jitter_ms(arrival, pts) == pytest.approx(0.0, abs=1e-9)
    assert interarrival_jitter_ms([a + 0.5 for a in arrival], pts) == pytest.approx(0.0, abs=1e-9)
    assert interarrival_jitter_ms(arrival[:1], pts[:1]) == 0.0  # the RFC's initial value


def test_jitter_of_one_late_frame_follows_rfc3550() -> None:
    arrival, pts = paced(5)
    arrival[2] += 0.010  # frame 2 arrives 10 ms late, the rest on time
    # D (ms) for pairs (0,1), (1,2), (2,3), (3,4): 0, +10, -10, 0; J += (|D| - J) / 16 from J = 0:
    j = 0.0
    j = j + (10 - j) / 16  # 0.625
    j = j + (10 - j) / 16  # 1.2109375
    j = j + (0 - j) / 16  # 1.13525390625
    assert j == 1.13525390625
    assert interarrival_jitter_ms(arrival, pts) == pytest.approx(j, abs=1e-9)


def test_jitter_uses_the_clock_rate() -> None:
    arrival = [0.0, 0.1, 0.3]  # media says 100 ms apart on a 1 kHz clock, the second gap took 200 ms
    assert interarrival_jitter_ms(arrival, [0, 100, 200], clock_rate=1000) == pytest.approx(100 / 16)


def test_viewer_on_a_paced_stream_never_stalls() -> None:
    arrival, pts = paced(90)
    assert simulate_viewer(arrival, pts) == ViewerResult(underruns=0, stall_ms=0.0, played=90, late_dropped=0,
                                                         startup_ms=pytest.approx(100.0))


def test_viewer_one_300ms_gap_with_100ms_buffer_stalls_once() -> None:
    arrival, pts = paced(20)
    gap_s = 0.300  # frame 10 arrives 300 ms after frame 9 instead of 33.3 ms; the stream then keeps pace
    arrival = [a + (gap_s - 1 / FPS if k >= 10 else 0.0) for k, a in enumerate(arrival)]
    # frame 10 is due at 0.100 + 10/30 = 0.4333 s and arrives at 9/30 + 0.300 = 0.6000 s:
    # stall = gap - frame interval - buffer = 300 - 33.33 - 100 = 166.67 ms; later frames are due exactly on arrival
    r = simulate_viewer(arrival, pts, start_buffer_ms=100.0)
    assert r.underruns == 1 and r.played == 20 and r.late_dropped == 0
    assert r.stall_ms == pytest.approx(300 - 1000 / FPS - 100)


def test_viewer_buffer_absorbs_a_short_gap_but_is_not_refilled_after_a_stall() -> None:
    arrival, pts = paced(30)
    short = [a + (0.120 - 1 / FPS if k >= 10 else 0.0) for k, a in enumerate(arrival)]
    assert simulate_viewer(short, pts, start_buffer_ms=100.0).underruns == 0  # 120 - 33.3 < 100

    # a 300 ms gap at frame 10, then a 100 ms gap at frame 20: the first stall empties the buffer for good,
    # so the second stalls for 100 - 33.33 ms
    two = [a + (0.300 - 1 / FPS if k >= 10 else 0.0) + (0.100 - 1 / FPS if k >= 20 else 0.0)
           for k, a in enumerate(arrival)]
    r = simulate_viewer(two, pts, start_buffer_ms=100.0)
    assert r.underruns == 2
    assert r.stall_ms == pytest.approx((300 - 1000 / FPS - 100) + (100 - 1000 / FPS))


def test_viewer_on_a_slow_stream_stalls_every_frame_once_the_buffer_is_gone() -> None:
    pts = [k * TICKS for k in range(10)]
    arrival = [0.050 * k for k in range(10)]  # 20 frames/s of 30 frames/s media
    # frame k is due at 0.1 + k/30 (no stall yet) and arrives at 0.05 k: late from k = 7 on (0.35 > 0.3333);
    # from then on every frame is due 1/30 s after the last arrival and arrives 1/20 s after it
    r = simulate_viewer(arrival, pts, start_buffer_ms=100.0)
    assert r.underruns == 3
    assert r.stall_ms == pytest.approx((0.05 * 9 - (0.1 + 9 / 30)) * 1e3)  # 50 ms: last arrival minus its due time
    assert real_time_factor(arrival, pts) == pytest.approx(0.45 / 0.30)


def test_viewer_drops_frames_with_non_increasing_pts() -> None:
    arrival = [0.0, 0.033, 0.034, 0.050, 0.060]
    pts = [0, 3000, 3000, 1500, 6000]  # a duplicate and one that goes back in time
    r = simulate_viewer(arrival, pts, start_buffer_ms=0.0)
    assert (r.played, r.late_dropped, r.underruns) == (3, 2, 0)


def test_viewer_startup_and_empty_stream() -> None:
    arrival, pts = paced(3, t0_s=5.0)
    assert simulate_viewer(arrival, pts, start_buffer_ms=50.0, requested_s=4.0).startup_ms == pytest.approx(1050.0)
    r = simulate_viewer([], [])
    assert (r.underruns, r.stall_ms, r.played, r.late_dropped) == (0, 0.0, 0, 0) and math.isnan(r.startup_ms)


def test_stream_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="arrival_s has 2 frames but pts has 1"):
        simulate_viewer([0.0, 1.0], [0])
    with pytest.raises(ValueError, match="receive order"):
        interarrival_jitter_ms([1.0, 0.5], [0, 3000])
    with pytest.raises(ValueError, match="non-finite"):
        real_time_factor([0.0, math.nan], [0, 3000])
    with pytest.raises(ValueError, match="start_buffer_ms must be >= 0"):
        simulate_viewer([0.0], [0], start_buffer_ms=-1.0)


def test_real_time_factor() -> None:
    arrival, pts = paced(31)
    assert real_time_factor(arrival, pts) == pytest.approx(1.0)
    assert real_time_factor([0.0, 0.5], [0, 90_000]) == pytest.approx(0.5)  # 1 s of media in 0.5 s
    assert math.isnan(real_time_factor([0.0], [0]))
    assert math.isnan(real_time_factor([0.0, 1.0], [7, 7]))


def test_slo_attained() -> None:
    assert slo_attained(80.0, 24.0, slo_mtp_ms=100.0, min_fps=24.0)
    assert slo_attained(100.0, 30.0, slo_mtp_ms=100.0, min_fps=24.0)  # bounds are inclusive
    assert not slo_attained(100.1, 30.0, slo_mtp_ms=100.0, min_fps=24.0)
    assert not slo_attained(50.0, 23.9, slo_mtp_ms=100.0, min_fps=24.0)
    assert not slo_attained(math.nan, 30.0, slo_mtp_ms=100.0, min_fps=24.0)  # no latency samples: not met
    with pytest.raises(ValueError, match="slo_mtp_ms must be positive"):
        slo_attained(1.0, 1.0, slo_mtp_ms=0.0, min_fps=1.0)
