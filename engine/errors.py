"""Errors raised by the engine; one base class, specific subclasses."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of engine errors."""


class StatePoolExhausted(EngineError):
    """No free state slot within the pool's byte budget (a session needs all of its declared state)."""


#: The older name (the pool once held only KV caches).
KVPoolExhausted = StatePoolExhausted


class StepFailed(EngineError):
    """A session's step raised or produced non-finite values; only that session ends."""


class DeviceWorkerDead(EngineError):
    """The device worker thread has stopped; no step will run."""
