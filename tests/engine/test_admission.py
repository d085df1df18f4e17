import pytest

from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy, SessionLoad, capacity, decide

PERIOD = 0.05  # 20 fps
COST = 0.01  # device s per frame per session: each always-on session uses 20 % of the device


def loads(n: int, duty: float, observed: float = 100.0) -> list[SessionLoad]:
    return [SessionLoad(duty_cycle=duty, observed_s=observed) for _ in range(n)]


def test_always_on_counts_every_session_fully() -> None:
    cfg = AdmissionConfig(policy=AdmissionPolicy.ALWAYS_ON, target_utilization=0.8)
    assert decide(cfg, admitted=loads(3, 0.3), frame_cost_s=COST, frame_period_s=PERIOD, kv_free_slots=9).admitted
    d = decide(cfg, admitted=loads(4, 0.3), frame_cost_s=COST, frame_period_s=PERIOD, kv_free_slots=9)
    assert not d.admitted and "exceeds target" in d.reason and d.retry_after_s > 0
    assert d.predicted_utilization == pytest.approx(1.0)


def test_duty_cycle_admits_more_idle_heavy_sessions() -> None:
    cfg = AdmissionConfig(policy=AdmissionPolicy.DUTY_CYCLE, target_utilization=0.8)
    # 10 sessions active 30 % of the time load 0.6; a newcomer is charged as always-on (0.2)
    assert decide(cfg, admitted=loads(10, 0.3), frame_cost_s=COST, frame_period_s=PERIOD, kv_free_slots=9).admitted
    assert not decide(cfg, admitted=loads(11, 0.3), frame_cost_s=COST, frame_period_s=PERIOD,
                      kv_free_slots=9).admitted
    always = AdmissionConfig(policy=AdmissionPolicy.ALWAYS_ON, target_utilization=0.8)
    assert capacity(cfg, duty_cycle=0.3, frame_cost_s=COST, frame_period_s=PERIOD) >= 2 * capacity(
        always, duty_cycle=0.3, frame_cost_s=COST, frame_period_s=PERIOD)


def test_unmeasured_sessions_count_at_the_default_duty() -> None:
    cfg = AdmissionConfig(policy=AdmissionPolicy.DUTY_CYCLE, target_utilization=0.8, min_observation_s=30)
    young = loads(4, 0.0, observed=5.0)  # idle so far, but not observed long enough to trust
    assert not decide(cfg, admitted=young, frame_cost_s=COST, frame_period_s=PERIOD, kv_free_slots=9).admitted


def test_static_policy_and_kv_limit() -> None:
    cfg = AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=2)
    assert decide(cfg, admitted=loads(1, 1), frame_cost_s=1.0, frame_period_s=PERIOD, kv_free_slots=1).admitted
    assert "limit" in decide(cfg, admitted=loads(2, 1), frame_cost_s=0, frame_period_s=PERIOD, kv_free_slots=5).reason
    full = decide(AdmissionConfig(), admitted=[], frame_cost_s=COST, frame_period_s=PERIOD, kv_free_slots=0)
    assert not full.admitted and "KV" in full.reason


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        AdmissionConfig(target_utilization=0)
    with pytest.raises(ValueError):
        AdmissionConfig(default_duty_cycle=1.5)
