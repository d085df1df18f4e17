"""Every error the server's transport raises, and the one place that maps errors to HTTP statuses and RPC
error codes.

The errors, by where they are raised: RPC and action parsing (`RpcError`), WebRTC offers (`InvalidOffer`),
starting images (`InvalidImage`), the fMP4 socket (`QueueOverflow`, `BoxError`), LiveKit rooms
(`LiveKitJoinError`, `LiveKitRoomTaken`) and Dreamverse messages (`PromptError`, `Refused`). The Python
clients' errors are `clients/errors.py`'s; the sessions layer's, which this maps, are `sessions/errors.py`'s.

RPC error codes follow JSON-RPC 2.0 (section 5.1) for protocol errors, with
application codes from -32000 down for session states.

This module imports nothing of the transport (every transport module may import it).
"""

from __future__ import annotations

from worldcast.sessions.errors import (
    CapacityExhausted,
    EngineNotFound,
    InvalidAction,
    InvalidConditioning,
    MoveFailed,
    RecordingNotFound,
    RecordingRefused,
    SessionClosedError,
    SessionNotFound,
    SnapshotNotFound,
    SnapshotRefused,
    SpectatorRefused,
    ViewerRefused,
)

# -- errors ----------------------------------------------------------------------------------------


class RpcError(Exception):
    """An RPC failure with a JSON-RPC error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InvalidOffer(ValueError):
    """An SDP offer this server refuses; the message says why (it names the m-line, 0-based)."""


class InvalidImage(ValueError):
    """The image is refused; the message says why (the field is always "image")."""


class QueueOverflow(Exception):
    """Too many control messages are waiting: the reader stopped reading for good."""


class BoxError(ValueError):
    """Bytes that are not the boxes expected (truncated, wrong type, bad size)."""


class LiveKitJoinError(Exception):
    """The world could not join its room (the message says why)."""


class LiveKitRoomTaken(Exception):
    """A create named a room it has no right to: another session's, or one that exists on the LiveKit server
    (the message says which). Answered 409; the caller may name no room (the server names a fresh one) or
    prove the right with the operator credential."""


class PromptError(ValueError):
    """A prompt Dreamverse would send that worldcast cannot use (blank, control characters)."""


class Refused(Exception):
    """A Dreamverse client message refused: `code` (the `error_code` sent) and a precise `message`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code, self.message = code, message


# -- codes -----------------------------------------------------------------------------------------

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SESSION_CLOSED = -32000
RATE_LIMITED = -32001
#: The caller's credential may not do this (a viewer token asking to act, direct or control on the worldcast stream;
#: `sessions/viewers.py`). Never sent over LiveKit, where a viewer cannot send data at all (`LIVEKIT_FORBIDDEN` is
#: the world's answer to a stranger).
FORBIDDEN = -32003

HTTP_STATUS: dict[type[Exception], int] = {
    SessionNotFound: 404,
    SessionClosedError: 409,
    InvalidAction: 400,
    InvalidConditioning: 422,
    CapacityExhausted: 503,
    EngineNotFound: 404,
    MoveFailed: 409,
    ViewerRefused: 429,
    RecordingRefused: 409,
    RecordingNotFound: 404,
    SnapshotRefused: 409,
    SnapshotNotFound: 404,
}

RPC_CODE: dict[type[Exception], int] = {
    SessionClosedError: SESSION_CLOSED,
    SessionNotFound: SESSION_CLOSED,
    InvalidAction: INVALID_PARAMS,
    InvalidConditioning: INVALID_PARAMS,
    RecordingRefused: INVALID_REQUEST,
}


def http_status(exc: Exception) -> int:
    if isinstance(exc, SpectatorRefused):  # the session's cap is the caller's to wait out; the server's is ours
        return 503 if exc.scope == "server" else 429
    for t, code in HTTP_STATUS.items():
        if isinstance(exc, t):
            return code
    return 500


def rpc_code(exc: Exception) -> int:
    for t, code in RPC_CODE.items():
        if isinstance(exc, t):
            return code
    return INTERNAL_ERROR

# -- LiveKit RPC ------------------------------------------------------------------------------------
# Our RPC errors as LiveKit RPC error codes (livekit rtc `RpcError`, python-sdks livekit-rtc/livekit/rtc/rpc.py).
# 1500-1599 is the SDK's application-error range; of it 1501-1505 are the SDK's own transport failures
# (timeouts, disconnects, payload size) and are never sent by us. The JSON-RPC code rides in the error's
# `data` as {"code": int}.

LIVEKIT_APPLICATION_ERROR = 1500  #: internal error (the SDK also sends it for a handler that raised)
LIVEKIT_FORBIDDEN = 1522  #: the caller is not the session's user

LIVEKIT_RPC_CODE: dict[int, int] = {
    INTERNAL_ERROR: LIVEKIT_APPLICATION_ERROR,
    PARSE_ERROR: 1510,
    INVALID_REQUEST: 1511,
    INVALID_PARAMS: 1512,
    METHOD_NOT_FOUND: 1513,
    SESSION_CLOSED: 1520,
    RATE_LIMITED: 1521,
}


def livekit_rpc_code(code: int) -> int:
    """The LiveKit RPC error code for one of our (JSON-RPC) error codes; unknown ones are 1500."""
    return LIVEKIT_RPC_CODE.get(code, LIVEKIT_APPLICATION_ERROR)
