"""The WebSocket stream of a session: fMP4 video out; actions, RPCs and directions in (one socket).

`StreamConnection` is this protocol's translation only; it composes the connection core
(`transport/connection.Connection`: guard, feedback, action and RPC dispatch, the close) and the protocol-neutral
socket (`socket.StreamSocket`: fMP4 sink, outbound queue, control loop), as Dreamverse's `/ws`
(`transport/dreamverse/connection.py`) does. Authentication and admission (`authenticate`, `serve_stream`) are here.

    GET /v1/sessions/{id}/stream   (WebSocket; the protocol is in docs/streaming.md)

Authentication: `Authorization: Bearer <token>` on the upgrade request, or
(browsers cannot set headers on a WebSocket) a first text message
`{"type": "auth", "token": ...}` within `AUTH_TIMEOUT_S`. A token in the URL
is refused: URLs end up in access logs.

Server -> client: binary messages are the fMP4 byte stream (the init segment,
then one media segment per frame, `transport/stream/fmp4.py`); text messages are
JSON events `{"event": name, ...}`; RPC replies are `{"id", "result" | "error"}`
exactly as on the data channel. Each media segment follows its `media` event;
`media_init` (MIME, codec) precedes the init segment.

Client -> server (text, at most `MAX_TEXT_BYTES`): an action message exactly as
on the `actions` data channel (`ActionHandler`), an RPC exactly as on the
`control` data channel (`RpcHandler`), or a typed message (`direction`,
`ping`). Bad input gets an `error` event naming what was wrong (or, for
actions and RPCs, the data channel's own `action_rejected` / RPC error) and
changes nothing; the socket stays open.

Spectators: a viewer token (`POST /v1/sessions/{id}/viewers`, `sessions/viewers.py`) opens the stream
read-only. A spectator's stream gets the same fMP4 from the session's one encode (`SessionEncode`) beside the
controller's (any number of spectators, within the caps, besides the controller's one stream); every action,
RPC and direction it sends is refused (an action: `action_rejected` with code -32003 `FORBIDDEN`; an RPC: its
JSON-RPC error -32003; a direction: an `error` event `view_only`) and changes nothing; pings are answered. It
neither wakes the session nor holds it open, and a spectator whose reader takes nothing for
`ViewerConfig.stall_s` while media waits is dropped (1008); revoking its token, or the token running out,
closes it (4403).

Close codes (RFC 6455 7.4.2 leaves 4000-4999 to applications): 4400 token in
the URL, 4401 no token, 4404 no such session for this token (an unknown id and
a wrong token alike, decided only once the token is in), 4408 no auth message
in time, 4409 the session already has a stream, 4403 the viewer token was revoked or ran out, 4429 the
session has as many spectators as it takes, 4503 the server has as many spectators as it takes, 1008 a
flooding client or a reader that stopped reading, 1000 the session closed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from worldcast.sessions.access import Access, authorize, count_spectators
from worldcast.sessions.directing import Segment, SegmentEnd
from worldcast.sessions.errors import DirectingRefusal, SessionError, SpectatorRefused
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import Session, SessionState
from worldcast.sessions.takes import takes_of
from worldcast.sessions.viewers import Spectator, ViewerConfig
from worldcast.transport.connection import Connection
from worldcast.transport.errors import FORBIDDEN, RpcError
from worldcast.transport.limits import InputGuard, Rejection
from worldcast.transport.rpc import parse_json
from worldcast.transport.schemas import MAX_CONTROL_BYTES, AuthMessage, DirectionMessage
from worldcast.transport.stream.fmp4 import Fmp4Encoder, Fmp4Fragmenter
from worldcast.transport.stream.queue import MediaItem
from worldcast.transport.stream.socket import (  # noqa: F401 - CLOSE_INTERNAL, MAX_PENDING_CONTROL re-exported
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    MAX_PENDING_CONTROL,
    REFUSED,
    StreamSocket,
    dumps,
    request_ref,
)

logger = logging.getLogger(__name__)

#: Largest text message a client may send, bytes (room for a 500-character prompt of 4-byte characters).
MAX_TEXT_BYTES = MAX_CONTROL_BYTES
#: How long a client without an Authorization header has to send its auth message, s.
AUTH_TIMEOUT_S = 10.0
#: How long a new stream waits for the session's previous stream to finish closing before it is refused
#: as busy, s (a client that closes and reconnects at once should not be refused).
BUSY_GRACE_S = 0.5
#: Unsent bytes the kernel may hold for a stream's socket (TCP_NOTSENT_LOWAT; Linux 3.12+): above it the
#: socket is not writable, so a reader that stops reading backs up into `OutboundQueue`, which drops media,
#: instead of into a send buffer that autotunes to megabytes and would replay seconds of old video.
NOTSENT_LOWAT_BYTES = 16 * 1024
#: High-water mark of the asyncio transport's own buffer above the kernel, bytes (asyncio's default,
#: 64 KiB, is seconds of this low-bitrate video): above it a send waits and media queues up to be dropped.
WRITE_BUFFER_HIGH_BYTES = 16 * 1024
#: Version of the stream protocol (docs/streaming.md), in `stream_start`.
PROTOCOL_VERSION = 1

CLOSE_TOKEN_IN_URL, CLOSE_UNAUTHORIZED = 4400, 4401
CLOSE_NOT_FOUND, CLOSE_AUTH_TIMEOUT, CLOSE_BUSY = 4404, 4408, 4409
CLOSE_REVOKED, CLOSE_SPECTATORS_SESSION, CLOSE_SPECTATORS_SERVER = 4403, 4429, 4503
#: What a spectator is told when it sends an action, an RPC or a direction.
VIEW_ONLY_MESSAGE = ("a viewer token can only watch: actions, RPCs and directions need the session's token")

#: Typed client messages of this protocol.
MESSAGE_TYPES = ("auth", "direction", "ping")


def validation_message(e: ValidationError) -> str:
    """'field: what is wrong' for the first error (the offending value is never echoed)."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "message"
    return f"{loc}: {err['msg']}"


def limit_unsent(transport: Any, nbytes: int = NOTSENT_LOWAT_BYTES,
                 high_water_bytes: int = WRITE_BUFFER_HIGH_BYTES) -> bool:
    """Bound the bytes waiting under a stream: TCP_NOTSENT_LOWAT on the socket (Linux) and the
    asyncio transport's write high-water mark. Returns False where the socket option cannot be set."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    opt = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if sock is None or opt is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, opt, nbytes)
        transport.set_write_buffer_limits(high=high_water_bytes)
    except (OSError, AttributeError, ValueError):
        return False
    return True


class StreamSocketTuning:
    """ASGI middleware: limit unsent kernel bytes on WebSocket connections (see NOTSENT_LOWAT_BYTES).

    ASGI hides the socket; the server's own `send` (uvicorn: a bound method of its protocol, which
    holds the asyncio transport) is reachable only outside Starlette's wrappers, so this must be
    added as middleware. The transport is left in `scope["extensions"]["worldcast.transport"]` for
    the stream's statistics. Other servers: nothing happens.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None and limit_unsent(transport):
                scope.setdefault("extensions", {})["worldcast.transport"] = transport
        await self.app(scope, receive, send)


async def reject(ws: WebSocket, code: str, message: str, close_code: int) -> None:
    """Send one error event and close (the socket was accepted so the client can read why)."""
    try:
        await ws.send_text(dumps({"event": "error", "code": code, "message": message}))
        await ws.close(close_code)
    except (WebSocketDisconnect, RuntimeError):
        pass


async def authenticate(ws: WebSocket, manager: SessionManager, session_id: str) -> Access | None:
    """Accept the socket and check its token (`sessions/access.authorize`); on failure send an error event,
    close and return None.

    The token is read (header, or the first message within `AUTH_TIMEOUT_S`) before the id is looked up,
    and an unknown id and a token that does not open the session are one answer (4404), so a caller
    without the session's token learns nothing about which ids exist.

    Returns:
        what the token opens: the session as its controller, or as a viewer (`Access.viewer`).
    """
    await ws.accept()
    if any(k.lower() in ("token", "access_token", "authorization") for k in ws.query_params):
        await reject(ws, "token_in_url", "send the token in the Authorization header or an auth message, "
                     "never in the URL", CLOSE_TOKEN_IN_URL)
        return None
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    if not token:
        try:
            raw = await asyncio.wait_for(ws.receive(), AUTH_TIMEOUT_S)
        except TimeoutError:
            await reject(ws, "auth_timeout", f"no auth message within {AUTH_TIMEOUT_S:g} s", CLOSE_AUTH_TIMEOUT)
            return None
        if raw["type"] == "websocket.disconnect":
            return None
        try:
            token = AuthMessage.model_validate(parse_json(raw.get("text") or b"", what="auth",
                                                          max_bytes=MAX_TEXT_BYTES)).token
        except (RpcError, ValidationError) as e:
            why = e.message if isinstance(e, RpcError) else validation_message(e)
            await reject(ws, "unauthorized", "send 'Authorization: Bearer <token>' or a first message "
                         f'{{"type": "auth", "token": ...}} ({why})', CLOSE_UNAUTHORIZED)
            return None
    access = authorize(manager.sessions, session_id, token)
    if access is None:
        await reject(ws, "session_not_found", "no such session for this token", CLOSE_NOT_FOUND)
        return None
    return access


class StreamConnection:
    """The worldcast stream protocol on one session's `StreamSocket` (docs/streaming.md).

    A protocol translation: client text to actions, RPCs and directions (through the connection core), and
    media items and session/segment events to this protocol's JSON events and fMP4 messages.

    Args:
        ws: the accepted, authenticated socket.
        session: its session.
        video_scale: integer upscale of the video.
        guard: the connection's limits and counters (`InputGuard`; default limits, uncounted, if None).
        on_frames: called with (outcome, frames) for every frame handed to the stream (`StreamSocket`).
        spectator: a viewer's read-only stream (see the module docstring; None: the controller's); its
            `close` is set here.
        stall_s: a spectator whose reader takes nothing for this long while media waits is dropped, s.

    Attributes:
        frames: what became of every frame handed to the stream (`FrameAccount`).
    """

    def __init__(self, ws: WebSocket, session: Session, *, video_scale: int = 1,
                 guard: InputGuard | None = None, on_frames: Callable[[str, int], None] | None = None,
                 spectator: Spectator | None = None, stall_s: float | None = None) -> None:
        self.session = session
        self.spectator = spectator
        #: the connection core; rejected and stale actions are answered with coalesced summaries, a flooder
        #: is told and closed
        self.conn = Connection(session, send=self.send_feedback, on_flood=lambda v: self.out.close(CLOSE_POLICY),
                               guard=guard, name="ws")
        self.out = StreamSocket(ws, session, self, self.conn, video_scale=video_scale, max_text_bytes=MAX_TEXT_BYTES,
                                on_frames=on_frames, spectator=spectator is not None, stall_s=stall_s)
        if spectator is not None:
            spectator.close = self._revoked
        self.director, self.guard = self.out.director, self.conn.guard
        #: the socket's video pipeline (`out`: also `transport`, `write_buffer_bytes`, `bytes_out`, `messages_in`)
        self.sink, self.queue, self.frames = self.out.sink, self.out.queue, self.out.frames
        self._fragmenter: Fmp4Fragmenter | None = None
        self._init_sent_for: Fmp4Encoder | None = None
        self.errors_sent = 0

    def __repr__(self) -> str:
        return f"StreamConnection({self.session.id}{'' if self.spectator is None else ', spectator'})"

    def _revoked(self, reason: str) -> None:
        """`Spectator.close`: the viewer's token was revoked or ran out (4403), or the session closed (1000)."""
        if reason == "session_closed":
            self.out.close(CLOSE_NORMAL)
            return
        self.error("viewer_" + reason, f"the viewer token was {reason}" if reason == "revoked"
                   else f"the viewer token has {reason}")
        self.out.close(CLOSE_REVOKED)

    async def run(self) -> None:
        """Serve the stream until the client leaves, the session closes or the reader stalls for good."""
        await self.out.run()

    async def aclose(self) -> None:
        """Detach from the session and stop every task (idempotent)."""
        await self.out.aclose()

    def close(self, code: int = CLOSE_NORMAL) -> None:
        """Close after the messages already queued have gone out (idempotent)."""
        self.out.close(code)

    # -- outgoing -----------------------------------------------------------------------------------

    def event(self, name: str, **fields: Any) -> None:
        """Queue a JSON event `{"event": name, **fields}` (never dropped)."""
        self.out.send_json({"event": name, **fields})

    def send_feedback(self, event: dict[str, Any]) -> None:
        """Send one of the guard's events (refusals, summaries, the flood verdict) in this protocol's shape."""
        self.out.send_json(event)

    def error(self, code: str, message: str, **fields: Any) -> None:
        """Queue an error event: a stable `code`, a precise `message` and what it refers to."""
        self.errors_sent += 1
        self.event("error", code=code, message=message, **fields)

    def render(self, item: MediaItem) -> list[str | bytes]:
        """The messages of one media item: (media_init + init segment when new), its event, its segment."""
        enc: Fmp4Encoder = item.meta["encoder"]
        out: list[str | bytes] = []
        if enc is not self._init_sent_for:
            self._init_sent_for = enc
            if self._fragmenter is None:
                self._fragmenter = Fmp4Fragmenter.from_encoder(enc)
            out += [dumps({"event": "media_init", "mime": enc.mime, "codec": enc.codec, "width": enc.width,
                           "height": enc.height, "timescale": enc.timescale, "frame_duration": enc.frame_duration,
                           "bytes": len(enc.init_segment)}), enc.init_segment]
        decode_time = self._fragmenter.next_decode_time()  # type: ignore[union-attr]
        data = self._fragmenter.fragment(item.sample)  # type: ignore[union-attr]
        ev = item.meta["event"] | {"keyframe": item.keyframe, "decode_time": decode_time, "bytes": len(data)}
        return out + [dumps({"event": "media", **ev}), data]

    # -- incoming -----------------------------------------------------------------------------------

    def on_text(self, text: str) -> None:
        """Dispatch one client text message (never raises for bad input).

        Every message is size- and rate-checked before it is parsed (`InputGuard.admit`, "stream"), and
        every refusal goes through the guard: one flood verdict whatever the client sends.
        """
        now, refuse = time.monotonic(), self.out.refuse
        obj = self.out.read(text, now, what="stream")
        if obj is REFUSED:
            return
        if not isinstance(obj, dict):
            refuse("bad_message", f"expected a JSON object, got {type(obj).__name__}", "invalid", now)
            return
        if self.spectator is not None and ("method" in obj or "seq" in obj or obj.get("type") == "direction"):
            self._refuse_view_only(obj, now)
        elif "method" in obj:
            self.out.queue_control(obj)
        elif "type" in obj:
            kind = obj["type"]
            if kind == "direction":
                self.out.queue_control(obj)
            elif kind == "ping":
                t = obj.get("t")
                ok = isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) and abs(t) < 1e15
                self.guard.accepted("stream", now)
                self.event("pong", t=t if ok else None)  # NaN/inf (which json.loads accepts) are not echoed
            elif kind == "auth":
                refuse("already_authenticated", "this stream is already authenticated", "invalid", now, type="auth")
            else:
                shown = kind[:64] if isinstance(kind, str) else type(kind).__name__
                refuse("unknown_type", f"unknown message type {shown!r}; types are {list(MESSAGE_TYPES)} "
                       "(actions and RPCs carry no type)", "invalid", now, type=shown)
        elif "seq" in obj:
            self.conn.take_action(text, now, parsed=obj)
        else:
            refuse("bad_message", "expected an action {seq, t, keys, mouse}, an RPC {id, method, params} "
                   f"or a typed message {{type, ...}} with type in {list(MESSAGE_TYPES)}", "invalid", now)

    def _refuse_view_only(self, obj: dict[str, Any], now_s: float) -> None:
        """A spectator's action, RPC or direction: refused in the shape its kind is refused in, counted by the
        guard (a spectator flooding them is closed like any flooder); nothing reaches the session."""
        g, feedback = self.guard, self.conn.feedback
        if "method" in obj:
            feedback.send_all(g.rejected_control(request_ref(obj), Rejection(FORBIDDEN, VIEW_ONLY_MESSAGE,
                                                                             "forbidden"), now_s))
        elif obj.get("type") == "direction":
            ref = request_ref(obj)
            self.out.refuse("view_only", VIEW_ONLY_MESSAGE, "forbidden", now_s, rid=ref, id=ref)
        else:
            feedback.send_all(g.rejected_action(FORBIDDEN, VIEW_ONLY_MESSAGE, seq=obj.get("seq"), now_s=now_s,
                                                outcome="forbidden"))

    async def handle_control(self, obj: dict[str, Any]) -> None:
        """Run one queued request (RPCs and directions here), one at a time, in arrival order."""
        if "method" in obj:
            reply = await self.conn.call(obj, time.monotonic())
            if reply is not None:  # None: a JSON-RPC 2.0 notification, never answered
                self.out.send_json(reply)
        else:
            await self._direct(obj)

    async def _direct(self, obj: dict[str, Any]) -> None:
        ref, now, refuse = request_ref(obj), time.monotonic(), self.out.refuse
        if self.director is None:
            refuse("not_directing", "directions need a directing session (POST /v1/sessions with "
                   '{"mode": "directing"}); this one is interactive', "invalid", now, rid=ref, id=ref)
            return
        try:
            d = DirectionMessage.model_validate(obj)
        except ValidationError as e:
            refuse("bad_direction", validation_message(e), "invalid", now, rid=ref, id=ref)
            return
        takes = None
        if d.from_segment is not None:  # take a segment again: refused before anything changes
            takes = takes_of(self.director)
            try:
                if takes is None:
                    raise DirectingRefusal("this session keeps no segment starts (its server runs with "
                                           "--retake-mib 0)")
                takes.check(d.from_segment)
            except DirectingRefusal as e:
                refuse("cannot_retake", str(e), "invalid", now, rid=ref, id=ref)
                return
        self.guard.accepted("control", now)
        try:
            context = await asyncio.get_running_loop().run_in_executor(None, self.session.encode_prompt, d.prompt)
        except SessionError as e:
            self.error("bad_direction", str(e), id=ref)
            return
        self.out.hold()  # the ack goes first, then the segment events it caused
        try:
            if takes is not None and d.from_segment is not None:
                ack = await takes.retake(d.from_segment, str(d.id), d.prompt, context, duration_s=d.duration_s,
                                         open_ended=d.open_ended)
            else:
                ack = self.director.direct(str(d.id), d.prompt, context, duration_s=d.duration_s,
                                           open_ended=d.open_ended)
        except DirectingRefusal as e:  # (its start went away meanwhile): nothing changed
            self.out.release()
            self.error("cannot_retake", str(e), id=ref)
            return
        except SessionError as e:
            self.out.release()
            self.error("session_closed", str(e), id=ref)
            return
        held = self.out.release()
        cut, seg_index, retake_of = ack.cut, ack.segment.index, ack.segment.retake_of
        self.out.send_rendered(lambda: [dumps({"event": "direction_ack", "id": d.id, "segment": seg_index,
                                               "retake_of": retake_of,
                                               "cut": None if cut is None else self.segment_summary(cut)})])
        for text in held:
            self.out.put(text)

    # -- session and segment events --------------------------------------------------------------------

    def segment_start(self, seg: Segment) -> None:
        self.event("segment_start", segment=seg.index, direction_id=seg.direction_id, prompt=seg.prompt,
                   epoch=seg.epoch, target_frames=seg.target_frames, retake_of=seg.retake_of)

    def segment_summary(self, seg: Segment) -> dict[str, object]:
        """`Segment.summary` as this stream delivered it: `frames` its frames sent, `dropped` those handed to
        this stream but not sent (`FrameAccount.dropped` says where). Final once rendered after the segment's
        queued media (a cut or stopped segment's undelivered frames are stale: never sent later)."""
        assert self.director is not None
        summary = seg.summary(self.director.fps)
        summary["frames"], summary["dropped"] = self.frames.segment(seg.index)
        return summary

    def segment_complete(self, seg: Segment) -> None:
        def enqueue() -> None:  # rendered when sent: after every media segment of it queued before
            self.out.send_rendered(lambda: [dumps({"event": "segment_complete", **self.segment_summary(seg)})])

        if seg.end == SegmentEnd.FINISHED:  # its last frames may still be in the encoder: after them
            self.sink.when_done(enqueue)
        else:  # cut or stopped: its queued frames were dropped
            enqueue()

    def on_state(self, session: Session, state: object) -> None:
        assert isinstance(state, SessionState)
        self.event("state", state=state.name.lower())
        if state == SessionState.CLOSED:
            self.out.close(CLOSE_NORMAL)

    def on_error(self, session: Session, reason: object) -> None:
        self.error(getattr(reason, "code", "session_failed"), str(reason))

    def on_control(self, session: Session, to: object) -> None:
        """Control was handed over (`Session.hand_over`): a controller's stream says so and closes (the new
        controller connects with its own token; a spectator's stream is not told and goes on)."""
        if self.spectator is not None:
            return
        self.error("control_handed_over", f"control of session {session.id} was handed to "
                   f"{'its owner' if to is None else 'viewer ' + str(to)}: this stream closes (reconnect to watch)")
        self.out.close(CLOSE_NORMAL)

    def opening(self) -> None:
        """The stream's first messages (`stream_start`)."""
        s, m = self.session, self.session.model.spec
        self.event("stream_start", protocol=PROTOCOL_VERSION, session_id=s.id, mode=s.mode, fps=m.fps,
                   frames_per_chunk=m.frames_per_chunk, model=m.name,
                   prompt=s.prompt if self.spectator is None else None, view_only=self.spectator is not None)


async def serve_stream(ws: WebSocket, session_id: str, *, manager: SessionManager,
                       streams: dict[str, StreamConnection], video_scale: int,
                       make_guard: Callable[[], InputGuard] = InputGuard,
                       on_frames: Callable[[str, int], None] | None = None,
                       viewers: ViewerConfig | None = None) -> None:
    """Serve GET /v1/sessions/{id}/stream: authenticate, refuse a second controller stream (a viewer's is a
    spectator, admitted against `viewers`' caps), run the connection."""
    access = await authenticate(ws, manager, session_id)
    if access is None:
        return
    session = access.session
    if "worldcast.transport" not in (ws.scope.get("extensions") or {}):
        logger.info("Session(%s): no unsent-bytes limit on the stream's socket (StreamSocketTuning); slow "
                    "readers are noticed only once the kernel's send buffer fills", session.id)
    if not access.controller:
        await _serve_spectator(ws, access, manager=manager, video_scale=video_scale, make_guard=make_guard,
                               on_frames=on_frames, config=viewers or ViewerConfig())
        return
    deadline = time.monotonic() + BUSY_GRACE_S
    while session.id in streams and time.monotonic() < deadline:  # a stream just closed may still be ending
        await asyncio.sleep(0.01)
    if session.id in streams:
        await reject(ws, "stream_busy", "this session already has a stream; close it first", CLOSE_BUSY)
        return
    conn = StreamConnection(ws, session, video_scale=video_scale, guard=make_guard(), on_frames=on_frames)
    streams[session.id] = conn
    try:
        await conn.run()
    finally:
        if streams.get(session.id) is conn:
            del streams[session.id]


async def _serve_spectator(ws: WebSocket, access: Access, *, manager: SessionManager, video_scale: int,
                           make_guard: Callable[[], InputGuard], on_frames: Callable[[str, int], None] | None,
                           config: ViewerConfig) -> None:
    """A viewer's read-only stream: admitted against the caps (refused with 4429 / 4503 and the reason), run,
    released whatever ends it."""
    session = access.session
    try:
        spectator = session.viewers.admit(config, kind="fmp4", viewer=access.viewer, close=lambda reason: None,
                                          server_spectators=count_spectators(list(manager.sessions.values())))
    except SpectatorRefused as e:
        code = CLOSE_SPECTATORS_SERVER if e.scope == "server" else CLOSE_SPECTATORS_SESSION
        await reject(ws, "spectators_full", str(e), code)
        return
    try:
        conn = StreamConnection(ws, session, video_scale=video_scale, guard=make_guard(), on_frames=on_frames,
                                spectator=spectator, stall_s=config.stall_s)
        await conn.run()
    finally:
        spectator.leave()
