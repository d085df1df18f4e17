"""Admission: let a new session in only if the device will still serve everyone well.

Pure policy, no I/O: callers pass the measured numbers in.

The load of a session is the share of device time it needs while generating,
`frame_cost_s / frame_period_s` (device seconds per frame over seconds per
frame of video), weighted by its duty cycle, the share of time it is
actually generating. A newcomer is admitted when

    sum_i duty_i * u + duty_new * u <= target_utilization,   u = frame_cost_s / frame_period_s

and a KV slot is free. Policies:

- `static`: at most `max_sessions`, whatever they cost;
- `always-on`: every session counts as if always generating (duty = 1);
- `duty-cycle`: measured duty cycles; a session observed for less than
  `min_observation_s` counts at `default_duty_cycle` (conservative: admission
  never relies on a duty cycle it has not measured).

This is the capacity argument of the design proposal (seed-excerpts, 9.1):
step interleaving buys fairness, duty cycle buys capacity.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


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
    target_utilization: float = 0.85  #: largest predicted share of device time in use, in (0, 1]
    default_duty_cycle: float = 1.0  #: duty cycle assumed before one is measured, in (0, 1]
    min_observation_s: float = 20.0  #: how long a session is observed before its measured duty cycle counts, s
    retry_after_s: float = 5.0  #: suggested wait on refusal, s

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must lie in (0, 1]")
        if not 0 < self.default_duty_cycle <= 1:
            raise ValueError("default_duty_cycle must lie in (0, 1]")
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")


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
    predicted_utilization: float  #: device share in use if admitted
    retry_after_s: float = 0.0  #: suggested wait when refused, s


def effective_duty(config: AdmissionConfig, load: SessionLoad) -> float:
    """The duty cycle admission charges a session under `config.policy`."""
    if config.policy != AdmissionPolicy.DUTY_CYCLE:
        return 1.0
    if load.observed_s < config.min_observation_s:
        return max(config.default_duty_cycle, load.duty_cycle)
    return min(1.0, max(0.0, load.duty_cycle))


def decide(
    config: AdmissionConfig,
    *,
    admitted: list[SessionLoad],
    frame_cost_s: float,
    frame_period_s: float,
    kv_free_slots: int,
) -> AdmissionDecision:
    """Admit or refuse one new session.

    Args:
        admitted: the sessions already admitted.
        frame_cost_s: measured device time per generated frame per session at the
            expected batch size, s (from the cost model).
        frame_period_s: seconds per frame of video (1 / fps).
        kv_free_slots: free slots in the KV pool.
    """
    u = frame_cost_s / frame_period_s
    duties = [effective_duty(config, s) for s in admitted]
    newcomer = 1.0 if config.policy != AdmissionPolicy.DUTY_CYCLE else config.default_duty_cycle
    util = (sum(duties) + newcomer) * u
    retry = config.retry_after_s
    if len(admitted) >= config.max_sessions:
        return AdmissionDecision(False, f"at the limit of {config.max_sessions} sessions", util, retry)
    if kv_free_slots < 1:
        return AdmissionDecision(False, "KV pool full", util, retry)
    if config.policy == AdmissionPolicy.STATIC:
        return AdmissionDecision(True, "under the session limit", util)
    if not admitted:  # an idle device serves one session, however slowly, rather than none
        return AdmissionDecision(True, "device idle", util)
    if util > config.target_utilization:
        return AdmissionDecision(
            False,
            f"predicted device utilization {util:.2f} exceeds target {config.target_utilization:.2f}",
            util,
            retry,
        )
    return AdmissionDecision(True, f"predicted device utilization {util:.2f}", util)


def capacity(config: AdmissionConfig, *, duty_cycle: float, frame_cost_s: float, frame_period_s: float) -> int:
    """How many identical sessions of `duty_cycle` the policy would admit (for reports)."""
    if config.policy == AdmissionPolicy.STATIC:
        return config.max_sessions
    d = 1.0 if config.policy == AdmissionPolicy.ALWAYS_ON else max(duty_cycle, 1e-9)
    u = frame_cost_s / frame_period_s
    n = math.floor(config.target_utilization / (d * u) + 1e-9) if u > 0 else config.max_sessions
    return max(0, min(config.max_sessions, n))
