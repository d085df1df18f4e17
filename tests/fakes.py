"""Shared test helpers: a fake clock and a scripted conditioner (stand-ins for time and a session), and the
engine side of a session's inputs without a worker (`EngineSide`)."""

from __future__ import annotations

import numpy as np

from worldcast.engine import scripted as engine_scripted
from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.model import make_spec
from worldcast.models.tinyworld.network import TinyWorldConfig

SPEC = make_spec(TinyWorldConfig())


class FakeClock:
    """A monotonic clock that moves only when told, s."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s

    def __call__(self) -> float:
        return self.now

    def advance(self, dt_s: float) -> None:
        self.now += dt_s


class ScriptedConditioner(engine_scripted.ScriptedConditioner):
    """The engine's scripted conditioner for TinyWorld, with held keys a test can set (`keys`)."""

    def __init__(self, prompt: np.ndarray | None = None, keys: dict[str, bool] | None = None) -> None:
        self.keys = keys or {}
        p = prompt if prompt is not None else np.eye(SPEC.conditioning.tensors[0][1][0], dtype=np.float32)[0]
        super().__init__(SPEC, action=lambda: world.action_vector(self.keys), context={"prompt": p})




class EngineSide:
    """Not a fake: a session's inputs as its engine keeps them (the real `SessionConditioner`, as an engine core
    holds it), fed through the session's `EngineLink` without a device worker; every message is logged in order."""

    def __init__(self, session) -> None:  # type: ignore[no-untyped-def]
        from worldcast.engine.conditioner import SessionConditioner

        self.cond = SessionConditioner(session.model, session.inputs.engine_state())
        self.log: list[object] = []
        session.inputs.attach(self)

    def push_input(self, delta) -> None:  # type: ignore[no-untyped-def]
        self.log.append(delta)
        self.cond.push(delta)

    def update(self, state) -> None:  # type: ignore[no-untyped-def]
        self.log.append(state)
        self.cond.update(state)

    engine_id = None  #: no engine: the conditioner alone
