"""Control RPCs as LiveKit RPC methods on the world participant.

Each of `RpcHandler`'s methods (flush, cancel, set_prompt, pause, resume,
get_state) is registered under its own name. The request payload is the
JSON params object (an empty payload means `{}`), the response payload
the JSON result. Errors raise `rtc.RpcError` with the code from
`transport/errors.livekit_rpc_code` and the JSON-RPC code in `data`.
Parsing and validation are `transport/rpc.py`'s: one parser for the data
channel, HTTP and LiveKit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from livekit import rtc

from worldcast.sessions.session import Session
from worldcast.transport import errors
from worldcast.transport.errors import RpcError
from worldcast.transport.feedback import InputFeedback
from worldcast.transport.limits import InputGuard
from worldcast.transport.rpc import RpcHandler, parse_json
from worldcast.transport.schemas import MAX_CONTROL_BYTES

logger = logging.getLogger(__name__)

#: The RPC methods a world registers.
METHODS = ("flush", "cancel", "set_prompt", "pause", "resume", "get_state")


def rpc_error(code: int, message: str) -> rtc.RpcError:
    """Our (JSON-RPC) error as a LiveKit RPC error."""
    return rtc.RpcError(errors.livekit_rpc_code(code), message, json.dumps({"code": code}))


class LiveKitRpc:
    """Serves one session's control RPCs to its user participant.

    Args:
        session: the target.
        user_identity: the identity allowed to call (None: nobody yet).
    """

    def __init__(self, session: Session, *,
                 user_identity: Callable[[], str | None], guard: InputGuard | None = None,
                 feedback: InputFeedback | None = None) -> None:
        self.handler = RpcHandler(session)
        self.session = session
        self._user = user_identity
        #: the world's guard: the user's RPCs share the control budget and the flood verdict with its packets
        self.guard = guard or InputGuard()
        self.feedback = feedback
        self.calls = self.refused = 0

    def register(self, participant: rtc.LocalParticipant) -> None:
        """Register every method on the world's local participant."""
        for name in METHODS:
            participant.register_rpc_method(name, self._bind(name))

    def _bind(self, method: str) -> Callable[[rtc.RpcInvocationData], Any]:
        async def handle(data: rtc.RpcInvocationData) -> str:
            return await self.invoke(method, data.caller_identity, data.payload, data.request_id)
        return handle

    async def invoke(self, method: str, caller: str, payload: str, request_id: str = "") -> str:
        """Run one call and return the response payload.

        Raises:
            rtc.RpcError: 1522 when `caller` is not the session's user; the mapped code of any RPC error.
        """
        self.calls += 1
        try:
            if caller != self._user():
                logger.info("%r: refused RPC %s from %r (not the session's user)", self.session, method, caller)
                raise rtc.RpcError(errors.LIVEKIT_FORBIDDEN, f"{caller!r} is not this session's user")
            now = time.monotonic()
            if self.feedback is not None and self.feedback.closed:
                raise rpc_error(errors.RATE_LIMITED, "this user flooded the session: its input is refused")
            if not self.guard.take("control", now):
                self._counted({"error": {"code": errors.RATE_LIMITED}}, now)
                raise rpc_error(errors.RATE_LIMITED, "too many control messages")
            try:
                params = parse_json(payload, what="control", max_bytes=MAX_CONTROL_BYTES) if payload.strip() else {}
            except RpcError as e:
                self._counted({"error": {"code": e.code}}, now)
                raise rpc_error(e.code, e.message) from None
            reply = await self.handler.handle({"id": request_id or None, "method": method, "params": params})
            self._counted(reply, now)
        except rtc.RpcError:
            self.refused += 1
            raise
        if "error" in reply:
            self.refused += 1
            raise rpc_error(reply["error"]["code"], reply["error"]["message"])
        return json.dumps(reply["result"], separators=(",", ":"))

    def _counted(self, reply: dict[str, Any], now_s: float) -> None:
        """Count one call in the guard (toward the flood verdict), then let the feedback act on a verdict."""
        self.guard.control_result(reply, now_s)
        if self.feedback is not None:
            self.feedback.send_all([])
