"""Errors raised by the engine; one base class, specific subclasses."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of engine errors."""


class StatePoolExhausted(EngineError):
    """No free state slot within the pool's byte budget (a session needs all of its declared state)."""


class EngineUnavailable(EngineError):
    """The engine is not ready (starting, lost or restarting) or went away mid-operation."""


class StepFailed(EngineError):
    """A session's step raised or produced non-finite values; only that session ends."""


class DeviceTooSmall(EngineError):
    """The device cannot hold one session's declared state within its memory budget (refused at start-up).

    Attributes:
        session_bytes: bytes of one session's declared state. budget_bytes: the state budget.
    """

    def __init__(self, message: str, *, session_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.session_bytes = session_bytes
        self.budget_bytes = budget_bytes
