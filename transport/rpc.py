"""Control RPCs and action messages: parse, validate, apply to a session.

Shared by every transport (the `control` / `actions` data channels, the HTTP
RPC route, LiveKit, WebSocket): one parser. A request that fails validation
changes nothing and gets a precise error, with the request's id whenever it
can be recovered (from the parsed object, or from the start of a message that
does not parse). JSON-RPC 2.0 framing (`"jsonrpc": "2.0"`, JSON-RPC 2.0
section 4) is accepted and echoed; a 2.0 request without an `id` member is a
notification: it runs and gets no reply (`handle` returns None). Batches
(JSON arrays) are refused. Limits and flood feedback live in
`transport/limits.py` (`InputGuard`), so every transport shares them too.

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
import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from worldcast.sessions.actions import SeqOutcome, SessionInputs
from worldcast.sessions.directing import director_of
from worldcast.sessions.errors import DirectingRefusal, InvalidAction, SessionError
from worldcast.sessions.session import Session
from worldcast.transport import errors
from worldcast.transport.errors import RpcError
from worldcast.transport.limits import InputGuard, TokenBucket, head_id
from worldcast.transport.schemas import (
    MAX_CONTROL_BYTES,
    MAX_MESSAGE_BYTES,
    ActionMessage,
    NoParams,
    RpcRequest,
    SetPromptParams,
)

logger = logging.getLogger(__name__)


def _validation_message(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "message"
    return f"{loc}: {err['msg']}"


#: Deepest JSON nesting a message may have (ours need 3); deeper is refused before `json.loads`, whose own
#: guard is Python's recursion limit and so depends on how deep the caller's stack already is.
MAX_DEPTH = 32
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"')


def _too_deep(raw: str | bytes) -> bool:
    """Whether `raw` opens more than `MAX_DEPTH` arrays/objects at once (brackets inside strings ignored).
    Cheap for ordinary messages: only one with more than `MAX_DEPTH` opening brackets is scanned."""
    opening = raw.count(b"[") + raw.count(b"{") if isinstance(raw, bytes) else raw.count("[") + raw.count("{")
    if opening <= MAX_DEPTH:
        return False
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    depth = 0
    for ch in _STRINGS.sub("", text):
        if ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def parse_json(raw: str | bytes, *, what: str, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Decode a data-channel message, enforcing the size limit.

    Raises:
        RpcError: too large (INVALID_REQUEST) or not JSON (PARSE_ERROR).
    """
    size = len(raw) if not isinstance(raw, str) or len(raw) > max_bytes else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise RpcError(errors.INVALID_REQUEST, f"{what} message of {size} bytes exceeds {max_bytes}")
    if _too_deep(raw):
        raise RpcError(errors.PARSE_ERROR, f"{what} message is nested too deeply (more than {MAX_DEPTH} levels)")
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


def _valid_id(x: Any) -> bool:
    """A JSON-RPC id this server echoes: an integer within +-2**53, a string of at most 64 characters, or null."""
    if x is None:
        return True
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return -(2**53) <= x <= 2**53
    return isinstance(x, str) and len(x) <= 64


def _frame(request: Any, rid: Any, body: dict[str, Any]) -> dict[str, Any]:
    """A reply: `{"jsonrpc": "2.0"}` first when the request used 2.0 framing, then the id and the body."""
    out: dict[str, Any] = {}
    if isinstance(request, dict) and request.get("jsonrpc") == "2.0":
        out["jsonrpc"] = "2.0"
    out["id"] = rid
    out.update(body)
    return out


def error_reply(request: Any, code: int, message: str) -> dict[str, Any]:
    """The error reply to `request` that a transport refuses before handling (e.g. rate-limited): the
    request's id when it is one this server echoes (else null), JSON-RPC 2.0 framing when it used it."""
    rid = request.get("id") if isinstance(request, dict) and _valid_id(request.get("id")) else None
    return _frame(request, rid, {"error": {"code": code, "message": message}})


#: Runs after a flush or cancel with the new epoch, before the reply goes out: a transport waits there
#: until its sinks have sent nothing older (see `SessionVideoTrack.settle`).
Settle = Callable[[int], Awaitable[None]]


class RpcHandler:
    """Dispatches control RPCs to one session.

    Args:
        session: the target (its `encode_prompt` encodes a new prompt, off the event loop).
        settle: awaited with the new epoch after `flush` and `cancel`, before they reply
            (None: reply at once).
    """

    def __init__(self, session: Session, *, settle: Settle | None = None) -> None:
        self.session = session
        self.settle = settle
        self._methods: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "flush": self._flush,
            "cancel": self._cancel,
            "set_prompt": self._set_prompt,
            "pause": self._pause,
            "resume": self._resume,
            "get_state": self._get_state,
            "record_start": self._record_start,
            "record_stop": self._record_stop,
        }

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    async def handle(self, request: Any) -> dict[str, Any] | None:
        """Run one request (already JSON-decoded) and build its reply: {"id", "result"} or {"id", "error"}
        (with "jsonrpc": "2.0" first if the request had it). None for a JSON-RPC 2.0 notification."""
        rid = request.get("id") if isinstance(request, dict) else None
        rid = rid if _valid_id(rid) else None
        notification = isinstance(request, dict) and request.get("jsonrpc") == "2.0" and "id" not in request
        try:
            try:
                if isinstance(request, list):
                    raise RpcError(errors.INVALID_REQUEST, "batch requests (JSON arrays) are not supported; "
                                   "send one request per message")
                if isinstance(request, dict) and not _valid_id(request.get("id")):
                    raise RpcError(errors.INVALID_REQUEST, "id: must be an integer within +-2**53, a string of "
                                   "at most 64 characters, or null")
                try:
                    req = RpcRequest.model_validate(request)
                except ValidationError as e:
                    raise RpcError(errors.INVALID_REQUEST, _validation_message(e)) from None
                fn = self._methods.get(req.method)
                if fn is None:
                    raise RpcError(errors.METHOD_NOT_FOUND,
                                   f"unknown method {req.method!r}; methods are {self.methods}")
                reply = _frame(request, req.id, {"result": await fn(req.params)})
            except RpcError as e:
                reply = _frame(request, rid, {"error": {"code": e.code, "message": e.message}})
            except SessionError as e:
                reply = _frame(request, rid, {"error": {"code": errors.rpc_code(e), "message": str(e)}})
        except Exception:
            if notification:
                logger.exception("%r: notification failed", self.session)
                return None
            raise
        return None if notification else reply

    async def handle_raw(self, raw: str | bytes, *, max_bytes: int = MAX_CONTROL_BYTES) -> dict[str, Any] | None:
        """Decode and run one message; errors that stop it parsing carry the id read from its start."""
        try:
            request = parse_json(raw, what="control", max_bytes=max_bytes)
        except RpcError as e:
            return {"id": head_id(raw), "error": {"code": e.code, "message": e.message}}
        return await self.handle(request)

    async def _settle(self, epoch: int) -> None:
        if self.settle is not None:
            await self.settle(epoch)

    async def _flush(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        epoch = self.session.flush()
        await self._settle(epoch)
        return {"epoch": epoch}

    async def _cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        epoch = self.session.cancel()
        await self._settle(epoch)
        return {"epoch": epoch}

    async def _set_prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        p = _params(SetPromptParams, params)
        self._directing_allows("set_prompt")
        if not self.session.takes_text:
            raise RpcError(errors.INVALID_PARAMS, f"prompt: {self.session.model.spec.name} takes no text prompt "
                           "(it is conditioned on its starting image)")
        context = await asyncio.get_running_loop().run_in_executor(None, self.session.encode_prompt, p.prompt)
        self.session.set_prompt(p.prompt, context)
        return {"prompt": p.prompt}

    async def _record_start(self, params: dict[str, Any]) -> dict[str, Any]:
        """Record the session from now (`SessionManager.start_recording`): its event log, not replayable (only one
        that begins with the session is: `"record": true` at create)."""
        _params(NoParams, params)
        if self.session.recorder is None:
            raise RpcError(errors.INVALID_REQUEST, "this session cannot be recorded here")
        await self.session.recorder()
        return {"recording": True, "replayable": False, "events": f"/v1/sessions/{self.session.id}/recording/events"}

    async def _record_stop(self, params: dict[str, Any]) -> dict[str, Any]:
        """Stop recording (the log is kept for its retention time); `stopped` false: it was not recording."""
        _params(NoParams, params)
        return {"stopped": self.session.stop_recording("asked") is not None}

    async def _pause(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        d = director_of(self.session)
        (d or self.session).pause()
        return {}

    async def _resume(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        d = director_of(self.session)
        if d is None:
            self.session.resume()
            return {}
        try:
            d.resume()  # an ended segment stays ended: a direction starts the next
            return {}
        except DirectingRefusal as e:
            raise RpcError(errors.INVALID_REQUEST, f"{e} (a direction on the session's stream)") from None

    def _directing_allows(self, method: str) -> None:
        """The directing layer's word on a control request of a directed session (its rules, not ours)."""
        d = director_of(self.session)
        if d is not None:
            try:
                d.check_control(method)
            except DirectingRefusal as e:
                raise RpcError(errors.INVALID_REQUEST, f'{e} ({{"type": "direction", "id", "prompt"}} on its '
                               "stream)") from None

    async def _get_state(self, params: dict[str, Any]) -> dict[str, Any]:
        _params(NoParams, params)
        return self.session.info()


#: `parsed`'s default where a message has not been decoded yet (None is a valid decoded message).
UNPARSED: Any = object()


class ActionHandler:
    """Validates `actions` messages and pushes them into a session's inputs, for any transport.

    Each message is checked for size and rate by its `InputGuard` before it is parsed;
    rejections and stale messages come back as the guard's coalesced events.

    Args:
        inputs: the target session's inputs (`Session.inputs`; the session hears of each push through
            `SessionInputs.on_push`, then the change goes to its engine through `SessionInputs.link`).
        guard: the connection's limits and feedback (default: `InputLimits()`).
    """

    def __init__(self, inputs: SessionInputs, *, guard: InputGuard | None = None) -> None:
        self.inputs = inputs
        self.guard = guard or InputGuard()
        self.accepted = 0
        self.rejected = 0
        self.ignored = 0

    def receive(self, raw: str | bytes, now_s: float, *, coalesce: bool = True,
                parsed: Any = UNPARSED) -> list[dict[str, Any]]:
        """Handle one message received at `now_s` (s, monotonic); returns the events to send now.

        With `coalesce` (the default) a flood's rejections come back as the guard's summaries, and the
        caller must also send `guard.drain(now)` at `guard.next_drain_s`; without it, each rejected
        or stale message gets its own event at once.

        Args:
            parsed: `raw` already decoded by the caller (a stream that parsed it to learn its kind), so it
                is not parsed twice; its size and rate are still checked on `raw` first.
        """
        g, c = self.guard, coalesce
        rej = g.admit("actions", raw, now_s)
        if rej is not None:
            self.rejected += 1
            return g.rejected_action(rej.code, rej.message, seq=None, now_s=now_s, outcome=rej.outcome, coalesce=c)
        msg: Any = None
        try:
            msg = (parse_json(raw, what="action", max_bytes=g.limits.max_action_bytes) if parsed is UNPARSED
                   else parsed)
            try:
                a = ActionMessage.model_validate(msg)
            except ValidationError as e:
                raise RpcError(errors.INVALID_PARAMS, _validation_message(e)) from None
            outcome = self.inputs.push(a.seq, a.keys, (float(a.mouse[0]), float(a.mouse[1])), axes=a.axes)
        except RpcError as e:
            self.rejected += 1
            return g.rejected_action(e.code, e.message, seq=_seq_of(msg), now_s=now_s, coalesce=c)
        except InvalidAction as e:
            self.rejected += 1
            return g.rejected_action(errors.INVALID_PARAMS, str(e), seq=_seq_of(msg), now_s=now_s, coalesce=c)
        except SessionError as e:
            self.rejected += 1
            return g.rejected_action(errors.rpc_code(e), str(e), seq=None, now_s=now_s, coalesce=c)
        if outcome is SeqOutcome.STALE:
            self.ignored += 1
            return g.ignored_action(a.seq, f"seq {a.seq} is not newer than {self.inputs.actions.last_seq}: "
                                    "keys and positions ignored, movement kept", now_s, coalesce=c)
        self.accepted += 1
        g.accepted("actions", now_s)
        return []


__all__ = ["UNPARSED", "ActionHandler", "RpcHandler", "Settle", "TokenBucket", "parse_json"]


def _seq_of(msg: Any) -> Any:
    return msg.get("seq") if isinstance(msg, dict) else None
