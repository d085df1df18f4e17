"""The connection core: what every client connection of a session does, whatever its protocol.

One `Connection` per client connection, composed (never subclassed) by each transport adapter:
WebRTC (`webrtc/peer.WebRTCPeer`), LiveKit (`livekit/world.LiveKitWorld`), the worldcast stream
(`stream/connection.StreamConnection`) and Dreamverse's `/ws` (`dreamverse/connection.DreamverseConnection`). It holds

- the input guard (`limits.InputGuard`: sizes, rates, the flood verdict) and the coalesced feedback
  (`feedback.InputFeedback`), which sends through the adapter's `send` in the adapter's shape;
- action dispatch (`rpc.ActionHandler`) and RPC dispatch (`rpc.RpcHandler`), each answering a handler
  failure with the data channel's `internal_error` instead of raising into the protocol's receive loop;
- the frame event every transport sends for a frame (`frame_event`, `frame_fields`: one builder);
- the connection's tasks and session subscriptions, and the one close: cancel every task, then await
  them, detach the sink, unsubscribe (idempotent; a second caller waits for the first).

An adapter only translates: its wire format in and out, and its own transport's teardown (`after`).
Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from worldcast.sessions.frames import FrameSink, VideoFrame
from worldcast.sessions.session import Session
from worldcast.transport.errors import INTERNAL_ERROR
from worldcast.transport.feedback import InputFeedback
from worldcast.transport.limits import InputGuard, head_id
from worldcast.transport.rpc import UNPARSED, ActionHandler, RpcHandler, Settle

logger = logging.getLogger(__name__)

#: The event answering an action whose handler failed (the client learns nothing of the bug).
ACTION_INTERNAL_ERROR = {"event": "action_rejected", "seq": None, "code": INTERNAL_ERROR, "message": "internal error"}


def frame_fields(frame: VideoFrame, now_s: float) -> dict[str, Any]:
    """A frame's metadata, as every transport sends it.

    Args:
        frame: the frame handed to the transport.
        now_s: the session's clock now, s (`Session.clock()`).

    Returns:
        `frame_index`, `pts` (90 kHz, RFC 3551), `action_seq`, `epoch`, `lateness_ms` (now minus the
        frame's presentation time, ms, 2 decimals) and `timings_ms` (per stage, ms, 2 decimals).
    """
    return {
        "frame_index": frame.frame_index,
        "pts": frame.pts,
        "action_seq": frame.action_seq,
        "epoch": frame.epoch,
        "lateness_ms": round((now_s - frame.present_at_s) * 1e3, 2),
        "timings_ms": {k: round(v, 2) for k, v in frame.timings_ms.items()},
    }


def frame_event(frame: VideoFrame, now_s: float) -> dict[str, Any]:
    """The `frame` event (WebRTC control channel, LiveKit `frames` topic): `{"event": "frame", **frame_fields}`."""
    return {"event": "frame", **frame_fields(frame, now_s)}


def retrieve(task: asyncio.Task[Any]) -> None:
    """Done-callback: retrieve a task's exception so it is logged once, not lost."""
    if not task.cancelled() and task.exception() is not None:
        logger.info("task %s ended: %r", task.get_name(), task.exception())


class Connection:
    """The protocol-neutral core of one client connection to one session.

    Args:
        session: the session it serves.
        send: sends one of the guard's events (refusals, summaries, the flood verdict) in the adapter's shape.
        on_flood: called once with the flood verdict after it was sent (the adapter closes, or stops taking input).
        guard: the connection's input guard (default limits, uncounted, if None).
        settle: for flush/cancel RPC replies (`RpcHandler`; default: the session's own).
        name: prefix of the connection's task names.
    """

    def __init__(self, session: Session, *, send: Callable[[dict[str, Any]], None],
                 on_flood: Callable[[dict[str, Any]], None], guard: InputGuard | None = None,
                 settle: Settle | None = None, name: str = "conn") -> None:
        self.session = session
        self.guard = guard or InputGuard()
        self.actions = ActionHandler(session.inputs, guard=self.guard)
        self.rpc = RpcHandler(session, settle=settle)
        self.feedback = InputFeedback(self.guard, send=send, on_flood=on_flood)
        self.tasks: set[asyncio.Task[Any]] = set()  #: live tasks of this connection (cancelled by `aclose`)
        self.closed = asyncio.Event()  #: set once `aclose` has finished
        self.closing = False  #: `aclose` has begun
        self._name = name
        self._unsubscribe: list[Callable[[], None]] = []

    # -- tasks and subscriptions -------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any] | None:
        """Run `coro` as a task of this connection (cancelled and awaited by `aclose`).

        Returns:
            the task, or None once the connection is closing (the coroutine is closed, never run).
        """
        if self.closing:
            coro.close()
            return None
        t = asyncio.get_running_loop().create_task(coro, name=name or f"{self._name}-{self.session.id}")
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        t.add_done_callback(retrieve)
        return t

    def subscribe(self, *unsubscribe: Callable[[], None]) -> None:
        """Keep subscriptions' unsubscribe functions (`Session.on`, `DirectingSession.on`) for `aclose`."""
        self._unsubscribe.extend(unsubscribe)

    # -- input ---------------------------------------------------------------------------------------

    def silenced(self, channel: str, now_s: float) -> bool:
        """Whether input is no longer taken (a flood verdict, or closing); if so the message is counted
        as dropped on `channel`."""
        if self.feedback.closed:
            self.guard.dropped(channel, now_s)
            return True
        return False

    def refuse(self, channel: str, code: str, message: str, outcome: str, now_s: float, *, rid: Any = None,
               **ref: Any) -> None:
        """Refuse one client message through the guard: counted toward the flood verdict, answered by a
        coalesced `error` event (the first of a quiet interval at once, the rest as one summary)."""
        self.feedback.send_all(self.guard.rejected_message(channel, code, message, now_s, outcome=outcome,
                                                            ref=ref, rid=rid))

    def take_action(self, raw: str | bytes, now_s: float, *, parsed: Any = UNPARSED) -> None:
        """Apply one action message (`ActionHandler.receive`; `parsed`: `raw` already decoded) and send what
        it produced (never raises)."""
        try:
            events = self.actions.receive(raw, now_s, parsed=parsed)
        except Exception:  # noqa: BLE001 - a handler bug must not break the protocol's receive loop
            logger.exception("%r: action handler failed", self.session)
            events = [dict(ACTION_INTERNAL_ERROR)]
        self.feedback.send_all(events)

    async def call(self, request: Any, now_s: float, *, raw: bool = False, max_bytes: int | None = None,
                   ) -> dict[str, Any] | None:
        """Run one RPC (`RpcHandler.handle`, or `handle_raw` for undecoded bytes) and count its result.

        Returns:
            the reply to send (None: a JSON-RPC 2.0 notification, never answered); a handler failure is an
            `internal_error` reply.
        """
        try:
            if raw:
                reply = await self.rpc.handle_raw(request, **({} if max_bytes is None else {"max_bytes": max_bytes}))
            else:
                reply = await self.rpc.handle(request)
        except Exception:  # noqa: BLE001
            logger.exception("%r: control handler failed", self.session)
            rid = head_id(request) if raw else (request.get("id") if isinstance(request, dict) else None)
            reply = {"id": rid, "error": {"code": INTERNAL_ERROR, "message": "internal error"}}
        if reply is not None:
            self.guard.control_result(reply, now_s)
        return reply

    # -- the close -------------------------------------------------------------------------------------

    async def aclose(self, *, sink: FrameSink | None = None,
                     after: Callable[[], Awaitable[None]] | None = None) -> bool:
        """Close the connection once: no more feedback, unsubscribe, detach `sink` from the session,
        cancel every task but the caller's, await them, then `after()` (the adapter's own teardown).

        Idempotent: a later call waits until the first has finished. `closed` is set when done, even if
        `after` raised.

        Returns:
            whether this call did the closing.
        """
        if self.closing:
            await self.closed.wait()
            return False
        self.closing = True
        try:
            self.feedback.close()
            for u in self._unsubscribe:
                u()
            self._unsubscribe.clear()
            if sink is not None:
                self.session.detach_sink(sink)
            current = asyncio.current_task()
            live = [t for t in self.tasks if t is not current]
            for t in live:
                t.cancel()
            await asyncio.gather(*live, return_exceptions=True)
            if after is not None:
                await after()
        finally:
            self.closed.set()
        return True
