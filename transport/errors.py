"""One place that maps errors to HTTP statuses and RPC error codes.

RPC error codes follow JSON-RPC 2.0 (section 5.1) for protocol errors, with
application codes from -32000 down for session states.
"""

from __future__ import annotations

from worldcast.sessions.errors import CapacityExhausted, InvalidAction, SessionClosedError, SessionNotFound

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SESSION_CLOSED = -32000
RATE_LIMITED = -32001

HTTP_STATUS: dict[type[Exception], int] = {
    SessionNotFound: 404,
    SessionClosedError: 409,
    InvalidAction: 400,
    CapacityExhausted: 503,
}

RPC_CODE: dict[type[Exception], int] = {
    SessionClosedError: SESSION_CLOSED,
    SessionNotFound: SESSION_CLOSED,
    InvalidAction: INVALID_PARAMS,
}


def http_status(exc: Exception) -> int:
    for t, code in HTTP_STATUS.items():
        if isinstance(exc, t):
            return code
    return 500


def rpc_code(exc: Exception) -> int:
    for t, code in RPC_CODE.items():
        if isinstance(exc, t):
            return code
    return INTERNAL_ERROR
