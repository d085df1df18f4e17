"""Errors raised by the engine; one base class, specific subclasses."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of engine errors."""


class KVPoolExhausted(EngineError):
    """No free KV slot within the pool's byte budget."""


class StepFailed(EngineError):
    """A session's step raised or produced non-finite values; only that session ends."""


class DeviceWorkerDead(EngineError):
    """The device worker thread has stopped; no step will run."""
