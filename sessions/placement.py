"""Placement: which engine core takes a new (or moving) session.

Each engine has its own state pool and its own measured cost model, so
admission is decided per engine (`engine/admission.py` `decide`, with that
engine's active capacity, free slots and the loads of the sessions on it),
and the session goes to the admitting engine with the most headroom:

    headroom = active capacity - expected sessions generating at once (the newcomer included)

ties broken by the lower overload probability, then fewer sessions, then
the lower engine id. Engines that are not ready (starting, lost,
restarting, stalled) or that are draining take nothing. The server-wide
`max_sessions` cap is checked first, across all engines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worldcast.engine.admission import AdmissionConfig, AdmissionDecision, SessionLoad, decide
from worldcast.engine.engine_handle import EngineHandle

#: `decide` per engine gets no session cap of its own (the server-wide one is checked before).
_NO_CAP = 1 << 30


@dataclass(frozen=True)
class Placement:
    """The outcome: the engine chosen (None: refused) and the decision behind it."""

    engine: EngineHandle | None
    decision: AdmissionDecision
    per_engine: dict[int, AdmissionDecision]  #: every candidate's decision, by engine id

    @property
    def admitted(self) -> bool:
        return self.engine is not None


def place(
    engines: Sequence[EngineHandle],
    *,
    config: AdmissionConfig,
    loads: Mapping[int, Sequence[SessionLoad]],
    pending: Mapping[int, int],
    prior_duty: float,
    open_sessions: int,
    exclude: EngineHandle | None = None,
) -> Placement:
    """Choose an engine for one more session.

    Args:
        engines: every engine of the server.
        config: the admission settings (policy, server-wide cap, utilisation target).
        loads: each engine's admitted sessions (by engine id), their measured duty cycles.
        pending: sessions admitted to each engine but not yet on it (encoding their conditioning).
        prior_duty: duty cycle charged to an unmeasured session (`DutyCyclePrior.value`).
        open_sessions: open sessions on the whole server (the cap counts these).
        exclude: an engine not to choose (a move's source).

    Returns:
        the placement; when refused, `decision` is the candidate closest to admitting (or says why no
        engine could take it) and carries the retry hint.
    """
    def refuse(reason: str) -> Placement:
        return Placement(None, AdmissionDecision(False, reason, 0.0, 0.0, 0, config.retry_after_s), {})

    if open_sessions >= config.max_sessions:
        return refuse(f"at the limit of {config.max_sessions} sessions")
    candidates = [e for e in engines if e.ready and not e.draining and e is not exclude]
    if not candidates:
        states = ", ".join(f"engine {e.id} {'draining' if e.draining else e.state}" for e in engines
                           if e is not exclude)
        return refuse(f"no engine can take a session ({states or 'none'})")
    per_config = dataclasses.replace(config, max_sessions=_NO_CAP)
    decisions: dict[int, AdmissionDecision] = {}
    for e in candidates:
        mine = list(loads.get(e.id, ())) + [SessionLoad(duty_cycle=prior_duty, observed_s=0.0)] * pending.get(e.id, 0)
        decisions[e.id] = decide(per_config, admitted=mine,
                                 active_capacity=e.active_capacity(config.target_utilization),
                                 kv_free_slots=e.free_slots - pending.get(e.id, 0), prior_duty=prior_duty)

    def rank(e: EngineHandle) -> tuple[float, float, int, int]:
        d = decisions[e.id]
        n = len(loads.get(e.id, ())) + pending.get(e.id, 0)
        return (-(d.active_capacity - d.expected_active), d.overload_probability, n, e.id)

    admitting = sorted((e for e in candidates if decisions[e.id].admitted), key=rank)
    if admitting:
        best = admitting[0]
        d = decisions[best.id]
        if len(engines) > 1:
            d = dataclasses.replace(d, reason=f"engine {best.id}: {d.reason}")
        return Placement(best, d, decisions)
    closest = sorted(candidates, key=rank)[0]
    d = decisions[closest.id]
    if len(candidates) > 1:
        d = dataclasses.replace(d, reason="no engine has room: " + "; ".join(
            f"engine {e.id}: {decisions[e.id].reason}" for e in candidates))
    skipped = [f"engine {e.id} {'draining' if e.draining else e.state}" for e in engines
               if e not in candidates and e is not exclude]
    if skipped:
        d = dataclasses.replace(d, reason=f"{d.reason} ({', '.join(skipped)})")
    return Placement(None, d, decisions)
