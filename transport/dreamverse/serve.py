"""Admitting a Dreamverse client on `WS /ws`: queue status, its `session_init_v2`, a directing session of its
own, then `DreamverseConnection` (transport/dreamverse/connection.py) until the socket closes (docs/streaming.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from worldcast.sessions.errors import CapacityExhausted, InvalidConditioning
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.projects import DEFAULT_SEGMENT_CAP
from worldcast.sessions.session import CloseReason
from worldcast.transport.dreamverse.connection import MAX_DREAMVERSE_BYTES, DreamverseConnection
from worldcast.transport.dreamverse.prompts import ProjectInit
from worldcast.transport.errors import RpcError
from worldcast.transport.limits import InputGuard
from worldcast.transport.rpc import parse_json
from worldcast.transport.stream.connection import CLOSE_NORMAL, CLOSE_POLICY, dumps

#: How long the server waits for session_init_v2, s. Dreamverse then starts without prompts; worldcast closes
#: the socket (4408, `init_timeout`): no session is made for a socket that never starts one.
INIT_TIMEOUT_S = 10.0
CLOSE_INIT_TIMEOUT = 4408
#: Messages other than session_init_v2 a socket may send before it, at most (then it is closed 1008).
MAX_PRE_INIT_MESSAGES = 16
#: Close code when the server has no room (RFC 6455 7.4.1: "try again later").
CLOSE_TRY_AGAIN_LATER = 1013


async def serve_dreamverse(ws: WebSocket, *, manager: SessionManager, video_scale: int, segment_s: float,
                           session_timeout_s: float, segment_cap: int = DEFAULT_SEGMENT_CAP,
                           make_guard: Callable[[], InputGuard] = InputGuard,
                           on_frames: Callable[[str, int], None] | None = None) -> None:
    """Serve `WS /ws`: queue status, wait for session_init_v2, open a directing session, stream it.

    The session belongs to the socket: it is closed when the socket closes.
    """
    await ws.accept()
    guard = make_guard()  # from the first message: one flood verdict for everything this socket sends
    admitted = manager.admission_decision().admitted
    try:
        await ws.send_text(dumps({"type": "queue_status", "position": 0 if admitted else 1, "total_gpus": 1,
                                  "available_gpus": 1 if admitted else 0}))
        init = await _wait_init(ws, guard)
    except (WebSocketDisconnect, RuntimeError):
        return
    if init is None:
        return
    project = ProjectInit.parse(init)
    for msg in project.errors:  # before the session is made, as Dreamverse checks its init first
        await ws.send_text(dumps({"type": "error", "message": msg, "error_code": "bad_prompt"}))
    project.errors = []
    first = project.prompts[0] if project.prompts else project.initial_prompt
    try:
        session = await manager.create(mode="directing", prompt=first)
    except InvalidConditioning as e:  # e.g. a model that takes no text: nothing to direct
        await ws.send_text(dumps({"type": "error", "message": f"cannot direct this model: {e}",
                                  "error_code": "unsupported_model"}))
        await ws.close(1008)
        return
    except CapacityExhausted as e:
        await ws.send_text(dumps({"type": "error", "message": f"no GPU available: {e}", "error_code": "capacity",
                                  "retry_after_s": e.retry_after_s}))
        await ws.close(CLOSE_TRY_AGAIN_LATER)
        return
    try:
        await ws.send_text(dumps({"type": "gpu_assigned", "gpu_id": 0, "session_timeout": session_timeout_s}))
        conn = DreamverseConnection(ws, session, video_scale=video_scale, init=project, segment_s=segment_s,
                                    segment_cap=segment_cap, session_timeout_s=session_timeout_s, guard=guard,
                                    on_frames=on_frames)
        await conn.run()
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        manager.close(session.id, CloseReason.CLIENT)


async def _wait_init(ws: WebSocket, guard: InputGuard) -> dict[str, Any] | None:
    """The session_init_v2 message; None if the client left, sent none within INIT_TIMEOUT_S (told, closed
    4408: a socket that never starts holds no session) or sent more than MAX_PRE_INIT_MESSAGES others
    (told, closed 1008). Messages before it are counted and answered through `guard` (coalesced)."""
    deadline = time.monotonic() + INIT_TIMEOUT_S
    refused = 0
    while True:
        try:
            msg = await asyncio.wait_for(ws.receive(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            await ws.send_text(dumps({"type": "error", "message": f"no session_init_v2 within {INIT_TIMEOUT_S:g} s",
                                      "error_code": "init_timeout"}))
            await ws.close(CLOSE_INIT_TIMEOUT)
            return None
        if msg["type"] == "websocket.disconnect":
            return None
        now = time.monotonic()
        raw = msg.get("text") if msg.get("text") is not None else (msg.get("bytes") or b"")
        rej = guard.admit("stream", raw, now, max_bytes=MAX_DREAMVERSE_BYTES)
        why, outcome = ("send session_init_v2 first", "invalid") if rej is None else (rej.message, rej.outcome)
        if rej is None and msg.get("text") is not None:
            try:
                data = parse_json(msg["text"], what="Dreamverse", max_bytes=MAX_DREAMVERSE_BYTES)
            except RpcError as e:
                data, why, outcome = None, e.message, "parse_error"
            if isinstance(data, dict) and data.get("type") == "session_init_v2":
                guard.accepted("stream", now)
                return data
            if isinstance(data, dict) and data.get("type") == "leave":
                await ws.close(CLOSE_NORMAL)
                return None
        refused += 1
        if refused > MAX_PRE_INIT_MESSAGES:
            await ws.send_text(dumps({"type": "error", "error_code": "flood", "message": f"more than "
                                      f"{MAX_PRE_INIT_MESSAGES} messages before session_init_v2"}))
            await ws.close(CLOSE_POLICY)
            return None
        for ev in guard.rejected_message("stream", "not_initialized", why, now, outcome=outcome):
            await ws.send_text(dumps({"type": "error", "message": ev["message"], "error_code": ev["code"],
                                      "count": ev["count"]}))
