import pytest

from worldcast.sessions.duty_cycle import DutyCycleMeter


def test_steady_share_converges_to_the_active_fraction() -> None:
    m = DutyCycleMeter(0.0, tau_s=60.0)
    t = 0.0
    for _ in range(200):  # 3 s on, 7 s off, for 2000 s
        m.update(t, True)
        t += 3.0
        m.update(t, False)
        t += 7.0
    assert m.value(t) == pytest.approx(0.3, abs=0.03)


def test_always_on_and_always_off() -> None:
    on, off = DutyCycleMeter(0.0), DutyCycleMeter(0.0)
    on.update(0.0, True)
    assert on.value(500.0) == pytest.approx(1.0)
    assert off.value(500.0) == 0.0
    assert on.observed_s(500.0) == 500.0


def test_recent_history_dominates() -> None:
    m = DutyCycleMeter(0.0, tau_s=30.0)
    m.update(0.0, True)
    m.update(600.0, False)  # long active, then idle for 5 tau
    assert m.value(750.0) < 0.01
