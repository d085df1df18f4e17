import math
from itertools import product

import pytest

from worldcast.engine.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    DutyCyclePrior,
    SessionLoad,
    active_capacity,
    capacity,
    decide,
    effective_duty,
    overload_probability,
)

DUTY = AdmissionPolicy.DUTY_CYCLE
ALWAYS = AdmissionPolicy.ALWAYS_ON


def loads(n: int, duty: float, observed: float = 100.0) -> list[SessionLoad]:
    return [SessionLoad(duty_cycle=duty, observed_s=observed) for _ in range(n)]


def brute_force_tail(duties: list[float], capacity: int) -> float:
    """P(N > capacity) by enumerating every on/off pattern."""
    total = 0.0
    for on in product([0, 1], repeat=len(duties)):
        if sum(on) > capacity:
            total += math.prod(p if o else 1 - p for p, o in zip(duties, on, strict=True))
    return total


@pytest.mark.parametrize("duties", [[0.3] * 6, [0.05, 0.9, 0.5, 0.3, 0.0, 1.0], [0.2, 0.7], []])
@pytest.mark.parametrize("cap", [0, 1, 2, 3, 7])
def test_overload_probability_is_the_poisson_binomial_tail(duties: list[float], cap: int) -> None:
    assert overload_probability(duties, cap) == pytest.approx(brute_force_tail(duties, cap), abs=1e-12)


def test_binomial_case_by_hand() -> None:
    # 4 sources on 30 % of the time, 2 fit: P(3) + P(4) = 4 * 0.3^3 * 0.7 + 0.3^4
    assert overload_probability([0.3] * 4, 2) == pytest.approx(4 * 0.027 * 0.7 + 0.0081)


def test_active_capacity_is_the_largest_batch_that_fits() -> None:
    chunk = {1: 0.030, 2: 0.040, 3: 0.046, 4: 0.055}.__getitem__  # s per chunk at batch b
    assert active_capacity(chunk, chunk_period_s=0.05, target_utilization=0.85, max_batch=4) == 2  # budget 42.5 ms
    assert active_capacity(chunk, chunk_period_s=0.05, target_utilization=1.0, max_batch=4) == 3
    assert active_capacity(chunk, chunk_period_s=0.05, target_utilization=1.0, max_batch=2) == 2
    assert active_capacity(chunk, chunk_period_s=0.02, target_utilization=1.0, max_batch=4) == 0


def test_one_session_needs_only_the_whole_period_not_the_shared_budget() -> None:
    chunk = {1: 0.045, 2: 0.070}.__getitem__  # 45 ms at batch 1: over the 42.5 ms shared budget, under 50 ms
    assert active_capacity(chunk, chunk_period_s=0.05, target_utilization=0.85, max_batch=2) == 1  # real time
    assert active_capacity(chunk, chunk_period_s=0.044, target_utilization=0.85, max_batch=2) == 0  # degraded
    assert active_capacity(chunk, chunk_period_s=0.05, target_utilization=0.85, max_batch=0) == 0


def test_always_on_admits_up_to_the_capacity() -> None:
    cfg = AdmissionConfig(policy=ALWAYS)
    assert decide(cfg, admitted=loads(2, 0.1), active_capacity=3, kv_free_slots=9).admitted
    d = decide(cfg, admitted=loads(3, 0.1), active_capacity=3, kv_free_slots=9)
    assert not d.admitted and "exceed the device's capacity of 3" in d.reason and d.retry_after_s > 0
    assert capacity(cfg, duty_cycle=0.3, active_capacity=3) == 3


def test_duty_cycle_admits_while_the_overload_tail_is_small() -> None:
    cfg = AdmissionConfig(policy=DUTY, max_overload_probability=0.05)
    # capacity 2, sessions on 30 %: with 3 the tail is 2.7 %, with 4 it is 8.4 %
    d3 = decide(cfg, admitted=loads(2, 0.3), active_capacity=2, kv_free_slots=9, prior_duty=0.3)
    assert d3.admitted and d3.overload_probability == pytest.approx(0.027)
    assert d3.expected_active == pytest.approx(0.9)
    d4 = decide(cfg, admitted=loads(3, 0.3), active_capacity=2, kv_free_slots=9, prior_duty=0.3)
    assert not d4.admitted and "8.4%" in d4.reason and d4.retry_after_s > 0
    # a looser limit lets the fourth in
    loose = AdmissionConfig(policy=DUTY, max_overload_probability=0.1)
    assert decide(loose, admitted=loads(3, 0.3), active_capacity=2, kv_free_slots=9, prior_duty=0.3).admitted


def test_duty_cycle_capacity_grows_with_the_device() -> None:
    cfg, always = AdmissionConfig(policy=DUTY), AdmissionConfig(policy=ALWAYS)
    ratios = [capacity(cfg, duty_cycle=0.3, active_capacity=c) / capacity(always, duty_cycle=0.3, active_capacity=c)
              for c in (2, 4, 8)]
    assert ratios == sorted(ratios) and ratios[0] >= 1.5 and ratios[-1] >= 2.0
    assert capacity(cfg, duty_cycle=1.0, active_capacity=4) == 4  # always-active sessions gain nothing


def test_unmeasured_sessions_move_from_the_prior_to_their_measurement() -> None:
    cfg = AdmissionConfig(policy=DUTY, min_observation_s=20)
    assert effective_duty(cfg, SessionLoad(1.0, 0.0), prior=0.3) == pytest.approx(0.3)
    assert effective_duty(cfg, SessionLoad(1.0, 10.0), prior=0.3) == pytest.approx(0.65)
    assert effective_duty(cfg, SessionLoad(0.1, 20.0), prior=0.9) == pytest.approx(0.1)
    assert effective_duty(AdmissionConfig(policy=ALWAYS), SessionLoad(0.1, 99.0), prior=0.1) == 1.0
    # with no measured session the prior is the default (always on): young idle sessions still count fully
    young = loads(2, 0.0, observed=0.0)
    d = decide(cfg, admitted=young, active_capacity=2, kv_free_slots=9)
    assert not d.admitted and d.expected_active == pytest.approx(3.0)


def test_duty_prior_is_the_mean_of_measured_sessions() -> None:
    prior = DutyCyclePrior(min_observation_s=10.0, default=1.0, memory=2)
    assert prior.value() == 1.0
    prior.record_departure(SessionLoad(0.9, 5.0))  # too briefly observed: ignored
    assert prior.value() == 1.0
    prior.record_departure(SessionLoad(0.2, 30.0))
    prior.record_departure(SessionLoad(0.4, 30.0))
    prior.record_departure(SessionLoad(0.6, 30.0))  # memory 2: the 0.2 is forgotten
    assert prior.value() == pytest.approx(0.5)
    assert prior.value([SessionLoad(0.2, 50.0), SessionLoad(1.0, 1.0)]) == pytest.approx(0.4)


def test_static_policy_and_kv_limit() -> None:
    cfg = AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=2)
    assert decide(cfg, admitted=loads(1, 1), active_capacity=0, kv_free_slots=1).admitted
    assert "limit" in decide(cfg, admitted=loads(2, 1), active_capacity=9, kv_free_slots=5).reason
    full = decide(AdmissionConfig(), admitted=[], active_capacity=4, kv_free_slots=0)
    assert not full.admitted and "KV" in full.reason


def test_an_idle_device_admits_one_session_even_if_it_is_slow() -> None:
    for policy in (DUTY, ALWAYS):
        cfg = AdmissionConfig(policy=policy)
        assert decide(cfg, admitted=[], active_capacity=0, kv_free_slots=1).admitted
        assert not decide(cfg, admitted=loads(1, 0.5), active_capacity=0, kv_free_slots=1, prior_duty=0.5).admitted


def test_config_validation() -> None:
    for bad in ({"target_utilization": 0}, {"default_duty_cycle": 1.5}, {"max_overload_probability": 1.0},
                {"max_overload_probability": -0.1}, {"min_observation_s": -1}, {"max_sessions": 0}):
        with pytest.raises(ValueError):
            AdmissionConfig(**bad)
