"""Control RPCs and action messages: parse, validate, apply to a session.

Shared by the `control` / `actions` data channels and the HTTP RPC route.
A request that fails validation changes nothing and gets a precise error.

Methods:
    flush()              -> {"epoch": int}  drop stale frames, restart the chunk
    cancel()             -> {"epoch": int}  stop at the next step boundary, until resume
    set_prompt(prompt)   -> {"prompt": str} condition the next chunks on a new prompt
    pause()              -> {}              stop generating; nothing dropped
    resume()             -> {}              restart after pause or cancel
    get_state()          -> the session summary
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from worldcast.sessions.errors import InvalidAction, SessionError
from worldcast.sessions.session import Session
from worldcast.transport import errors
from worldcast.transport.schemas import (
    MAX_CONTROL_BYTES,
    MAX_MESSAGE_BYTES,
    ActionMessage,
    NoParams,
    RpcRequest,
    SetPromptParams,
)

logger = logging.getLogger(__name__)


class RpcError(Exception):
    """An RPC failure with a JSON-RPC error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _validation_message(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "message"
    return f"{loc}: {err['msg']}"


def parse_json(raw: str | bytes, *, what: str, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Decode a data-channel message, enforcing the size limit.

    Raises:
        RpcError: too large (INVALID_REQUEST) or not JSON (PARSE_ERROR).
    """
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise RpcError(errors.INVALID_REQUEST, f"{what} message of {size} bytes exceeds {max_bytes}")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RpcError(errors.PARSE_ERROR, f"{what} message is not valid JSON: {e}") from None
    except RecursionError:
        raise RpcError(errors.PARSE_ERROR, f"{what} message is nested too deeply") from None


def _params(model: type[BaseModel], params: dict[str, Any]) -> Any:
    try:
        return model.model_validate(params)
    except ValidationError as e:
        raise RpcError(errors.INVALID_PARAMS, _validation_message(e)) from None


class RpcHandler:
    """Dispatches control RPCs to one session.

    Args:
        session: the target.
        encode_prompt: text -> embedding (run off the event loop).
    """

    def __init__(self, session: Session, encode_prompt: Callable[[str], Any]) -> None:
        self.session = session
        self.encode_prompt = encode_prompt
        self._methods: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "flush": self._flush,
            "cancel": self._cancel,
            "set_prompt": self._set_prompt,
            "pause": self._pause,
            "resume": self._resume,
            "get_state": self._get_state,
        }

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    async def handle(self, request: Any) -> dict[str, Any]:
        """Run one request (already JSON-decoded) and build its reply: {"id", "result"} or {"id", "error"}."""
        rid = request.get("id") if isinstance(request, dict) else None
        try:
            try:
                req = RpcRequest.model_validate(request)
            except ValidationError as e:
                raise RpcError(errors.INVALID_REQUEST, _validation_message(e)) from None
            fn = self._methods.get(req.method)
            if fn is None:
                raise RpcError(errors.METHOD_NOT_FOUND, f"unknown method {req.method!r}; methods are {self.methods}")
            return {"id": req.id, "result": await fn(req.params)}
        except RpcError as e:
            return {"id": rid, "error": {"code": e.code, "message": e.message}}
        except SessionError as e:
            return {"id": rid, "error": {"code": errors.rpc_code(e), "message": str(e)}}

    async def handle_raw(self, raw: str | bytes) -> dict[str, Any]:
        try:
            request = parse_json(raw, what="control", max_bytes=MAX_CONTROL_BYTES)
        except RpcError as e:
            return {"id": None, "error": {"code": e.code, "message": e.message}}
        return await self.handle(request)

    async def _flush(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        return {"epoch": self.session.flush()}

    async def _cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        return {"epoch": self.session.cancel()}

    async def _set_prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        p = _params(SetPromptParams, params)
        emb = await asyncio.get_running_loop().run_in_executor(None, self.encode_prompt, p.prompt)
        self.session.set_prompt(p.prompt, emb)
        return {"prompt": p.prompt}

    async def _pause(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        self.session.pause()
        return {}

    async def _resume(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        self.session.resume()
        return {}

    async def _get_state(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        return self.session.info()


class TokenBucket:
    """Rate limiter: `rate_hz` tokens per second, bursts up to `burst` (time passed in)."""

    def __init__(self, rate_hz: float, burst: float) -> None:
        self.rate_hz, self.burst = rate_hz, burst
        self._tokens, self._last_s = burst, None

    def take(self, now_s: float) -> bool:
        if self._last_s is not None:
            self._tokens = min(self.burst, self._tokens + (now_s - self._last_s) * self.rate_hz)
        self._last_s = now_s
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class ActionHandler:
    """Validates `actions` channel messages and pushes them into a session.

    At most `rate_hz` messages per second are applied (bursts of `burst`);
    the excess is rejected. `handle_raw` returns None on success or an error
    event to send back.
    """

    def __init__(self, session: Session, *, rate_hz: float = 250.0, burst: float = 60.0) -> None:
        self.session = session
        self.bucket = TokenBucket(rate_hz, burst)
        self.accepted = 0
        self.rejected = 0

    def handle_raw(self, raw: str | bytes) -> dict[str, Any] | None:
        msg: Any = None
        try:
            msg = parse_json(raw, what="action")
            if not self.bucket.take(time.monotonic()):
                raise RpcError(errors.RATE_LIMITED, "too many action messages; slow down")
            try:
                a = ActionMessage.model_validate(msg)
            except ValidationError as e:
                raise RpcError(errors.INVALID_PARAMS, _validation_message(e)) from None
            self.session.push_action(a.seq, a.keys, (float(a.mouse[0]), float(a.mouse[1])))
        except RpcError as e:
            self.rejected += 1
            return {"event": "action_rejected", "seq": _seq_of(msg), "code": e.code, "message": e.message}
        except InvalidAction as e:
            self.rejected += 1
            return {"event": "action_rejected", "seq": _seq_of(msg), "code": errors.INVALID_PARAMS,
                    "message": str(e)}
        except SessionError as e:
            self.rejected += 1
            return {"event": "action_rejected", "seq": None, "code": errors.rpc_code(e), "message": str(e)}
        self.accepted += 1
        return None


def _seq_of(msg: Any) -> Any:
    return msg.get("seq") if isinstance(msg, dict) else None
