"""Admission: let a new session in only if the device will still serve everyone well.

Pure policy, no I/O: callers pass the measured numbers in.

The device carries `active_capacity` sessions generating at once: the
largest batch whose measured chunk time fits `target_utilization` of a
chunk period (`active_capacity`, from the `CostModel`). Sessions are on/off
sources: each generates a share of the time, its duty cycle, and costs
nothing while idle. Policies:

- `static`: at most `max_sessions`, whatever they cost;
- `always-on`: every session counts as always generating, so at most
  `active_capacity` sessions are admitted;
- `duty-cycle`: sessions generate independently with probability equal to
  their duty cycles, and a newcomer is admitted when the probability that
  more than `active_capacity` of them (itself included) generate at once
  stays at or below `max_overload_probability`. This is bufferless
  statistical multiplexing of on/off sources: the number generating at once
  is Poisson-binomial and its tail is the share of time the device would be
  overloaded (bufferless multiplexing of on/off sources; Kelly 1996,
  "Notes on effective bandwidths"). Frames late through overload are then
  bounded by that share, which is why the default equals the 5 % of frames
  the on-time target leaves.

Duty cycles: a session's own measurement counts fully once it has been
observed for `min_observation_s`; before that its charge moves linearly
from the prior to its measurement (`effective_duty`). The prior is the
mean duty cycle measured over sessions observed long enough, current and
recently departed (`DutyCyclePrior`); with no history it is
`default_duty_cycle` (1.0: as if always on).

This is the capacity argument of the design proposal (seed-excerpts, 9.1):
step interleaving buys fairness, duty cycle buys capacity.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class AdmissionPolicy(enum.StrEnum):
    """How sessions are admitted."""

    STATIC = "static"
    ALWAYS_ON = "always-on"
    DUTY_CYCLE = "duty-cycle"


@dataclass(frozen=True)
class AdmissionConfig:
    """Admission settings."""

    policy: AdmissionPolicy = AdmissionPolicy.DUTY_CYCLE
    max_sessions: int = 16  #: hard cap on open sessions (all policies)
    target_utilization: float = 0.85  #: largest share of a chunk period one batched chunk may take, in (0, 1]
    max_overload_probability: float = 0.05  #: duty-cycle: largest share of time more sessions generate than fit
    default_duty_cycle: float = 1.0  #: duty cycle assumed before any session has been measured, in (0, 1]
    min_observation_s: float = 20.0  #: how long a session is observed before its own duty cycle counts fully, s
    retry_after_s: float = 5.0  #: suggested wait on refusal, s

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must lie in (0, 1]")
        if not 0 <= self.max_overload_probability < 1:
            raise ValueError("max_overload_probability must lie in [0, 1)")
        if not 0 < self.default_duty_cycle <= 1:
            raise ValueError("default_duty_cycle must lie in (0, 1]")
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        if self.min_observation_s < 0:
            raise ValueError("min_observation_s must be >= 0")


@dataclass(frozen=True)
class SessionLoad:
    """What admission knows of an admitted session."""

    duty_cycle: float  #: measured share of time generating, in [0, 1]
    observed_s: float  #: how long it has been measured, s


@dataclass(frozen=True)
class AdmissionDecision:
    """The outcome, with the numbers behind it."""

    admitted: bool
    reason: str  #: why (for logs, metrics and the 503 body)
    expected_active: float  #: mean number of sessions generating at once if admitted
    overload_probability: float  #: share of time more than `active_capacity` would generate if admitted
    active_capacity: int  #: sessions the device carries generating at once
    retry_after_s: float = 0.0  #: suggested wait when refused, s


@dataclass
class DutyCyclePrior:
    """The duty cycle expected of a session not yet measured: the mean over measured ones.

    Sessions count once observed for `min_observation_s`: those still open
    (passed to `value`) and the last `memory` that left (`record_departure`).

    Args:
        min_observation_s: how long a session must be observed to count, s.
        default: the prior with no measured session, in (0, 1].
        memory: departed sessions remembered.
    """

    min_observation_s: float
    default: float = 1.0
    memory: int = 64
    _departed: deque[float] = field(default_factory=deque)

    def record_departure(self, load: SessionLoad) -> None:
        """Remember a departing session's measured duty cycle (ignored if observed too briefly)."""
        if load.observed_s >= self.min_observation_s:
            self._departed.append(min(1.0, max(0.0, load.duty_cycle)))
            while len(self._departed) > self.memory:
                self._departed.popleft()

    def value(self, current: Sequence[SessionLoad] = ()) -> float:
        """The prior duty cycle, in [0, 1]."""
        measured = list(self._departed) + [
            min(1.0, max(0.0, s.duty_cycle)) for s in current if s.observed_s >= self.min_observation_s
        ]
        return sum(measured) / len(measured) if measured else self.default


def effective_duty(config: AdmissionConfig, load: SessionLoad, prior: float) -> float:
    """The duty cycle admission charges a session under `config.policy`.

    `always-on` and `static` charge 1. `duty-cycle` moves linearly from
    `prior` (just admitted) to the session's own measurement (observed for
    `min_observation_s` or longer).
    """
    if config.policy != AdmissionPolicy.DUTY_CYCLE:
        return 1.0
    measured = min(1.0, max(0.0, load.duty_cycle))
    w = 1.0 if config.min_observation_s <= 0 else min(1.0, max(0.0, load.observed_s / config.min_observation_s))
    return (1 - w) * prior + w * measured


def overload_probability(duties: Sequence[float], capacity: int) -> float:
    """P(more than `capacity` of independent on/off sources are on at once).

    Args:
        duties: each source's probability of being on, in [0, 1].
        capacity: sources that fit at once (>= 0).

    Returns:
        the Poisson-binomial upper tail P(N > capacity), by the O(n^2)
        recursion over sources on the distribution of N.
    """
    if capacity >= len(duties):
        return 0.0
    dist = [1.0]  # dist[k] = P(N = k) over the sources seen so far
    for p in duties:
        p = min(1.0, max(0.0, p))
        nxt = [0.0] * (len(dist) + 1)
        for k, q in enumerate(dist):
            nxt[k] += q * (1 - p)
            nxt[k + 1] += q * p
        dist = nxt
    return max(0.0, min(1.0, sum(dist[capacity + 1 :])))


def active_capacity(chunk_time_s: Callable[[int], float], *, chunk_period_s: float, target_utilization: float,
                    max_batch: int) -> int:
    """Most sessions that can generate at once: the largest batch b <= `max_batch` with
    chunk_time_s(b) <= target_utilization * chunk_period_s; else 1 if one session's chunk fits the
    whole chunk period (real time, without the headroom that sharing the device needs); else 0
    (the device is degraded: even one session runs below real time).

    Args:
        chunk_time_s: predicted device time of one chunk at batch size b, s (`StepScheduler.chunk_time_s`).
        chunk_period_s: video time of one chunk, s (frames per chunk / fps).
        target_utilization: share of a chunk period a batched chunk may take when sessions share the device.
    """
    budget = target_utilization * chunk_period_s
    best = 0
    for b in range(1, max_batch + 1):
        if chunk_time_s(b) <= budget:
            best = b
    if best == 0 and max_batch >= 1 and chunk_time_s(1) <= chunk_period_s:
        best = 1
    return best


def decide(
    config: AdmissionConfig,
    *,
    admitted: Sequence[SessionLoad],
    active_capacity: int,
    kv_free_slots: int,
    prior_duty: float | None = None,
) -> AdmissionDecision:
    """Admit or refuse one new session.

    Args:
        admitted: the sessions already admitted.
        active_capacity: sessions the device carries generating at once (`active_capacity()`).
        kv_free_slots: free slots in the KV pool.
        prior_duty: duty cycle expected of an unmeasured session (`DutyCyclePrior.value`);
            None uses `config.default_duty_cycle`.
    """
    prior = config.default_duty_cycle if prior_duty is None else min(1.0, max(0.0, prior_duty))
    duties = [effective_duty(config, s, prior) for s in admitted]
    duties.append(prior if config.policy == AdmissionPolicy.DUTY_CYCLE else 1.0)  # the newcomer
    expected = sum(duties)
    p_over = overload_probability(duties, active_capacity)

    def out(ok: bool, reason: str) -> AdmissionDecision:
        return AdmissionDecision(ok, reason, expected, p_over, active_capacity, 0.0 if ok else config.retry_after_s)

    if len(admitted) >= config.max_sessions:
        return out(False, f"at the limit of {config.max_sessions} sessions")
    if kv_free_slots < 1:
        return out(False, "KV pool full")
    if config.policy == AdmissionPolicy.STATIC:
        return out(True, "under the session limit")
    if not admitted:  # an idle device serves one session, however slowly, rather than none
        return out(True, "device idle" if active_capacity else
                   "device idle (degraded: its measured chunk time exceeds the chunk budget, so it serves "
                   "one session at a time, below real time)")
    if active_capacity == 0:
        return out(False, "device degraded: its measured chunk time exceeds the chunk budget even for one "
                          "session, so it serves one session at a time")
    if config.policy == AdmissionPolicy.ALWAYS_ON:
        if len(duties) > active_capacity:
            return out(False, f"{len(duties)} sessions generating at once exceed the device's "
                              f"capacity of {active_capacity}")
        return out(True, f"{len(duties)} of {active_capacity} sessions the device carries at once")
    if p_over > config.max_overload_probability:
        return out(False, f"more than {active_capacity} of {len(duties)} sessions would generate at once "
                          f"{p_over:.1%} of the time (limit {config.max_overload_probability:.1%})")
    return out(True, f"overload {p_over:.1%} of the time (limit {config.max_overload_probability:.1%}), "
                     f"{expected:.2f} sessions generating at once on average")


def capacity(config: AdmissionConfig, *, duty_cycle: float, active_capacity: int) -> int:
    """How many identical, fully measured sessions of `duty_cycle` the policy would admit (for reports)."""
    n = 0
    while n < config.max_sessions:
        loads = [SessionLoad(duty_cycle=duty_cycle, observed_s=float("inf"))] * n
        if not decide(config, admitted=loads, active_capacity=active_capacity, kv_free_slots=1,
                      prior_duty=duty_cycle).admitted:
            break
        n += 1
    return n
