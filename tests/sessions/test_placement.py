"""Placement: the admitting engine with the most headroom; none that is not ready or draining."""

from __future__ import annotations

from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy, SessionLoad
from worldcast.sessions.placement import place


class FakeEngine:
    """FAKE engine handle: just what placement reads (ready, draining, capacity, free slots)."""

    def __init__(self, engine_id: int, *, capacity: int = 4, free: int = 8, state: str = "ready") -> None:
        self.id, self.capacity, self._free, self.state = engine_id, capacity, free, state
        self.draining = False

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def free_slots(self) -> int:
        return self._free

    def active_capacity(self, target_utilization: float) -> int:
        return self.capacity


def loads(*counts: int, duty: float = 1.0) -> dict[int, list[SessionLoad]]:
    return {i: [SessionLoad(duty_cycle=duty, observed_s=1e9)] * n for i, n in enumerate(counts)}


STATIC = AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=4)
DUTY = AdmissionConfig(policy=AdmissionPolicy.DUTY_CYCLE, max_sessions=64, min_observation_s=0)


def test_static_admission_spreads_sessions_over_engines_and_keeps_the_server_wide_cap() -> None:
    engines = [FakeEngine(0), FakeEngine(1)]
    got = []
    per: dict[int, int] = {0: 0, 1: 0}
    for n in range(4):
        p = place(engines, config=STATIC, loads=loads(per[0], per[1]), pending={}, prior_duty=1.0, open_sessions=n)
        assert p.engine is not None
        got.append(p.engine.id)
        per[p.engine.id] += 1
    assert got == [0, 1, 0, 1]
    p = place(engines, config=STATIC, loads=loads(2, 2), pending={}, prior_duty=1.0, open_sessions=4)
    assert p.engine is None and "limit of 4 sessions" in p.decision.reason and p.decision.retry_after_s > 0


def test_the_engine_with_the_most_headroom_by_its_own_cost_model_wins() -> None:
    fast, slow = FakeEngine(0, capacity=6), FakeEngine(1, capacity=2)
    p = place([fast, slow], config=DUTY, loads=loads(3, 0, duty=1.0), pending={}, prior_duty=1.0, open_sessions=3)
    assert p.engine is fast  # 6 - 4 = 2 left against 2 - 1 = 1
    p = place([fast, slow], config=DUTY, loads=loads(5, 0, duty=1.0), pending={}, prior_duty=1.0, open_sessions=5)
    assert p.engine is slow
    p = place([fast, slow], config=DUTY, loads=loads(5, 0), pending={1: 2}, prior_duty=1.0, open_sessions=5)
    assert p.engine is fast, "sessions being created on engine 1 count there"


def test_lost_restarting_draining_and_full_engines_take_nothing() -> None:
    a, b, c, d = FakeEngine(0, state="lost"), FakeEngine(1, state="restarting"), FakeEngine(2), FakeEngine(3, free=0)
    c.draining = True
    p = place([a, b, c, d], config=STATIC, loads=loads(0, 0, 0, 0), pending={}, prior_duty=1.0, open_sessions=0)
    assert p.engine is None and "KV pool full" in p.decision.reason
    d._free = 1
    p = place([a, b, c, d], config=STATIC, loads=loads(0, 0, 0, 0), pending={}, prior_duty=1.0, open_sessions=0)
    assert p.engine is d
    p = place([a, b, c], config=STATIC, loads=loads(0, 0, 0), pending={}, prior_duty=1.0, open_sessions=0)
    assert p.engine is None
    assert p.decision.reason == "no engine can take a session (engine 0 lost, engine 1 restarting, engine 2 draining)"
    p = place([c, d], config=STATIC, loads=loads(0, 0), pending={}, prior_duty=1.0, open_sessions=0, exclude=d)
    assert p.engine is None  # a move's source is never its target


def test_one_engine_decides_as_the_single_device_admission_did() -> None:
    e = FakeEngine(0, capacity=1)
    p = place([e], config=DUTY, loads=loads(1, duty=1.0), pending={}, prior_duty=1.0, open_sessions=1)
    assert p.engine is None and p.decision.reason.startswith("more than 1 of 2 sessions would generate")
