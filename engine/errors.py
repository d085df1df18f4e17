"""Every error the engine raises, one base class (`EngineError`) and specific subclasses: the device's
(pool, steps, memory), the engine process's (its frame ring) and a moved session's state bytes.

Private control flow inside one module (`step_runner._SessionTimeout`) stays in that module."""

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


class SessionStateError(EngineError, ValueError):
    """Bytes that are not a session state this engine can take (another model, version or device kind)
    (`session_state.parse`, `restore`); a `ValueError` too, as bad input."""


class ShmFrameRingFull(EngineError):
    """Every slot of an engine process's frame ring holds a frame the reader has not released yet
    (`process/shm_frames.ShmFrameRing.write`)."""
