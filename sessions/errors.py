"""Every error the sessions layer raises (sessions, their manager, placement and moves, the directing layer),
one base class (`SessionError`) and specific subclasses; `transport/errors.py` maps them to HTTP and RPC
codes."""

from __future__ import annotations


class SessionError(Exception):
    """Base class of session errors."""


class SessionNotFound(SessionError):
    """No session with that id."""


class SessionClosedError(SessionError):
    """The session is closed; nothing more can be done with it."""


class InvalidAction(SessionError):
    """An action message that breaks the action schema (the reason is in the message)."""


class CapacityExhausted(SessionError):
    """No room for another session; retry later.

    Attributes:
        retry_after_s: suggested wait before retrying, seconds.
    """

    def __init__(self, message: str, *, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidConditioning(SessionError):
    """A session's conditioning (prompt, image, mode) is refused; nothing was allocated or changed.

    Attributes:
        field: the request field at fault ("prompt", "image", "mode").
        reason: why, in words.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class EngineNotFound(SessionError):
    """No engine core with that id."""


class MoveFailed(SessionError):
    """A session could not move between engines (the reason is in the message); where it stayed is said too."""


class DirectingRefusal(SessionError):
    """A request a directed session refuses (a control RPC whose job a direction does, a resume before the
    first direction); its `str` says why and what to send instead (`directing.DirectingSession`). The
    transport answers it as an invalid request (`rpc.RpcHandler`), never as the session's failure."""


class ViewerRefused(SessionError):
    """A viewer token is refused: the session has as many live viewer tokens as it may, or is closed (the
    message says which). Answered 429."""


class SpectatorRefused(SessionError):
    """A spectator stream is refused (`viewers.Viewers.admit`).

    Attributes:
        scope: "session" (the session's cap, or the viewer's token revoked meanwhile: 429) or "server" (the
            server's cap: 503).
        retry_after_s: suggested wait before retrying, s.
    """

    def __init__(self, message: str, *, scope: str, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.scope = scope
        self.retry_after_s = retry_after_s


class RecordingRefused(SessionError):
    """A recording cannot start (this server does not record, the quota is full, the disk refused, or it is
    recording already); the session itself is not affected. Answered 409."""


class RecordingNotFound(SessionError):
    """No recording of that session for that token (never made, deleted, or past its retention). Answered 404."""


class SnapshotRefused(SessionError):
    """A snapshot cannot be taken or used: the store is full, the server keeps none, it is of another format,
    model or weights, or its files are cut or edited (the message says which); nothing is half restored.
    Answered 409."""


class SnapshotNotFound(SessionError):
    """No snapshot of that id for that token (never made, deleted). Answered 404."""
