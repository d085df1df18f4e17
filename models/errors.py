"""Errors of the models package."""

from __future__ import annotations


class ModelError(Exception):
    """Base class of model errors."""


class ConditioningError(ModelError, ValueError):
    """A session's conditioning request is refused (nothing is allocated).

    Attributes:
        field: the request field at fault ("prompt", "image").
        reason: why, in words.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownModel(ModelError, KeyError):
    """`--model NAME[:VARIANT]` names no registered family or variant."""

    def __str__(self) -> str:  # KeyError quotes its argument; say it plainly
        return str(self.args[0]) if self.args else "unknown model"
