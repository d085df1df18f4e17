"""Every error the Python clients raise: refused before sending (`UnknownKey`, `MessageTooLarge`, both
`ValueError`s) and the server's answers (`RpcFailed` over WebRTC, `StreamError` over the WebSocket stream).
`worldcast.transport.clients` exports them all."""

from __future__ import annotations

from typing import Any


class UnknownKey(ValueError):
    """An action names a key the served model does not declare; nothing was sent."""


class MessageTooLarge(ValueError):
    """A message over the server's size limit; it was not sent.

    Attributes:
        size_bytes: its UTF-8 size.
        limit_bytes: the limit.
    """

    def __init__(self, what: str, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"{what} message of {size_bytes} bytes exceeds the server's limit of {limit_bytes} bytes")
        self.size_bytes, self.limit_bytes = size_bytes, limit_bytes


class RpcFailed(Exception):
    """The server answered an RPC with an error.

    Attributes:
        code: JSON-RPC error code.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class StreamError(Exception):
    """The server answered a request with an error event or RPC error.

    Attributes:
        code: the error code (a string for stream errors, a JSON-RPC number for RPCs).
        event: the whole error message.
    """

    def __init__(self, code: str | int, message: str, event: dict[str, Any]) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.event = code, event
