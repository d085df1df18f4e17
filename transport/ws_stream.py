"""The WebSocket stream of a session: fMP4 video out; actions, RPCs and directions in (one socket).

    GET /v1/sessions/{id}/stream   (WebSocket; the protocol is in docs/streaming.md)

Authentication: `Authorization: Bearer <token>` on the upgrade request, or
(browsers cannot set headers on a WebSocket) a first text message
`{"type": "auth", "token": ...}` within `AUTH_TIMEOUT_S`. A token in the URL
is refused: URLs end up in access logs.

Server -> client: binary messages are the fMP4 byte stream (the init segment,
then one media segment per frame, `transport/fmp4.py`); text messages are
JSON events `{"event": name, ...}`; RPC replies are `{"id", "result" | "error"}`
exactly as on the data channel. Each media segment follows its `media` event;
`media_init` (MIME, codec) precedes the init segment.

Client -> server (text, at most `MAX_TEXT_BYTES`): an action message exactly as
on the `actions` data channel (`ActionHandler`), an RPC exactly as on the
`control` data channel (`RpcHandler`), or a typed message (`direction`,
`ping`). Bad input gets an `error` event naming what was wrong (or, for
actions and RPCs, the data channel's own `action_rejected` / RPC error) and
changes nothing; the socket stays open.

Close codes (RFC 6455 7.4.2 leaves 4000-4999 to applications): 4400 token in
the URL, 4401 no token, 4404 no such session for this token (an unknown id and
a wrong token alike, decided only once the token is in), 4408 no auth message
in time, 4409 the session already has a stream, 1008 a flooding client or a
reader that stopped reading, 1000 the session closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from worldcast.sessions.directing import Segment, SegmentEnd, director_of
from worldcast.sessions.errors import SessionError
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import Session, SessionState, VideoFrame
from worldcast.transport import errors
from worldcast.transport.feedback import InputFeedback
from worldcast.transport.fmp4 import EncodedSample, Fmp4Encoder, Fmp4Fragmenter, Fmp4Sink
from worldcast.transport.limits import InputGuard, Rejection
from worldcast.transport.rpc import ActionHandler, RpcError, RpcHandler, parse_json
from worldcast.transport.schemas import MAX_CONTROL_BYTES, AuthMessage, DirectionMessage
from worldcast.transport.ws_queue import Close, FrameAccount, MediaItem, OutboundQueue, QueueOverflow, Render

logger = logging.getLogger(__name__)

#: Largest text message a client may send, bytes (room for a 500-character prompt of 4-byte characters).
MAX_TEXT_BYTES = MAX_CONTROL_BYTES
#: How long a client without an Authorization header has to send its auth message, s.
AUTH_TIMEOUT_S = 10.0
#: Control requests (RPCs, directions) waiting to run, at most.
MAX_PENDING_CONTROL = 32
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

CLOSE_NORMAL, CLOSE_POLICY, CLOSE_INTERNAL = 1000, 1008, 1011
CLOSE_TOKEN_IN_URL, CLOSE_UNAUTHORIZED = 4400, 4401
CLOSE_NOT_FOUND, CLOSE_AUTH_TIMEOUT, CLOSE_BUSY = 4404, 4408, 4409
#: Compared against when the id is unknown, so that an unknown id and a wrong token take the same time.
_NO_TOKEN = secrets.token_urlsafe(24)

#: Typed client messages of this protocol.
MESSAGE_TYPES = ("auth", "direction", "ping")


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def validation_message(e: ValidationError) -> str:
    """'field: what is wrong' for the first error (the offending value is never echoed)."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "message"
    return f"{loc}: {err['msg']}"


def frame_meta(frame: VideoFrame, now_s: float) -> dict[str, Any]:
    """A frame's metadata as sent in media events (times in ms)."""
    return {
        "frame_index": frame.frame_index,
        "pts": frame.pts,
        "action_seq": frame.action_seq,
        "epoch": frame.epoch,
        "lateness_ms": round((now_s - frame.present_at_s) * 1e3, 2),
        "timings_ms": {k: round(v, 2) for k, v in frame.timings_ms.items()},
    }


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


async def authenticate(ws: WebSocket, manager: SessionManager, session_id: str) -> Session | None:
    """Accept the socket and check its token; on failure send an error event, close and return None.

    The token is read (header, or the first message within `AUTH_TIMEOUT_S`) before the id is looked up,
    and an unknown id and a token that does not open the session are one answer (4404), so a caller
    without the session's token learns nothing about which ids exist.
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
    session = manager.sessions.get(session_id)
    open_ = session is not None and session.state != SessionState.CLOSED
    expected = session.token if open_ else _NO_TOKEN  # type: ignore[union-attr]
    if not secrets.compare_digest(token.encode(), expected.encode()) or not open_:
        await reject(ws, "session_not_found", "no such session for this token", CLOSE_NOT_FOUND)
        return None
    return session


class StreamConnection:
    """One client's WebSocket stream of one session.

    Args:
        ws: the accepted, authenticated socket.
        session: its session.
        video_scale: integer upscale of the video.
        guard: the connection's limits and counters (`InputGuard`; default limits, uncounted, if None).
        on_frames: called with (outcome, frames) for every frame handed to the stream: "sent" or
            "dropped_<reason>" (`FrameAccount`; the metrics' `on_stream_frames`).

    Attributes:
        frames: what became of every frame handed to the stream (`FrameAccount`).
    """

    def __init__(self, ws: WebSocket, session: Session, *, video_scale: int = 1,
                 guard: InputGuard | None = None, on_frames: Callable[[str, int], None] | None = None) -> None:
        self.ws, self.session = ws, session
        self.director = director_of(session)  #: the directing layer over the session (None: interactive)
        self.frames = FrameAccount(on_count=on_frames)
        self.sink = Fmp4Sink(fps=session.model.spec.fps, on_sample=self._on_sample, epoch_fn=session.current_epoch,
                             on_clear=self._on_clear, scale=video_scale, stamp=session.stamp_frames,
                             depth=max(2, session.model.spec.frames_per_chunk), name=session.id,
                             on_drop=self.frames.count_dropped)
        self.queue = OutboundQueue(on_need_keyframe=self.sink.request_keyframe, on_drop=self.frames.count_dropped)
        self._tap = _CountingSink(self.sink, self._count_handed)  #: what the session delivers to
        self.rpc = RpcHandler(session)
        self.guard = guard or InputGuard()
        self.actions = ActionHandler(session, guard=self.guard)
        #: rejected and stale actions are answered with coalesced summaries; a flooder is told and closed
        self.feedback = InputFeedback(self.guard, send=self.send_feedback, on_flood=lambda v: self.close(CLOSE_POLICY))
        self._control: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_PENDING_CONTROL)
        self._fragmenter: Fmp4Fragmenter | None = None
        self._init_sent_for: Fmp4Encoder | None = None
        self._held: list[str | Render] | None = None  #: events held back while a direction is applied
        self._unsubscribe: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._close_code: int | None = None
        self._aborted = False  #: the connection was dropped (a reader that stopped reading)
        self._closed = False
        self.messages_in = 0
        self.errors_sent = 0
        self.bytes_out = 0
        #: the asyncio transport under the socket (None: unknown server), for `write_buffer_bytes`
        self.transport = (ws.scope.get("extensions") or {}).get("worldcast.transport")

    def __repr__(self) -> str:
        return f"StreamConnection({self.session.id})"

    @property
    def write_buffer_bytes(self) -> int:
        """Bytes accepted for sending but not yet handed to the kernel (the transport's buffer)."""
        return int(self.transport.get_write_buffer_size()) if self.transport is not None else 0

    # -- outgoing -----------------------------------------------------------------------------------

    def event(self, name: str, **fields: Any) -> None:
        """Queue a JSON event `{"event": name, **fields}` (never dropped)."""
        self.send_json({"event": name, **fields})

    def send_json(self, obj: dict[str, Any]) -> None:
        text = dumps(obj)
        if self._held is not None and "event" in obj:
            self._held.append(text)
            return
        self._put(text)

    def send_feedback(self, event: dict[str, Any]) -> None:
        """Send one of the guard's events (refusals, summaries, the flood verdict) in this protocol's shape."""
        self.send_json(event)

    def send_rendered(self, fn: Callable[[], list[str | bytes]]) -> None:
        """Queue messages rendered when they are sent (held like events while a direction is applied)."""
        if self._held is not None:
            self._held.append(Render(fn))
            return
        self._put(Render(fn))

    def _put(self, text: str | Render) -> None:
        if self._aborted:
            return
        try:
            self.queue.put_control(text)
        except QueueOverflow as e:
            # the reader is not reading: a close frame would wait behind what it never reads, so drop
            # the connection now (its run loop then detaches the sink and ends)
            logger.warning("%r: %s; dropping the connection", self, e)
            self._aborted = True
            self.close(CLOSE_POLICY)
            if self.transport is not None:
                self.transport.abort()

    def error(self, code: str, message: str, **fields: Any) -> None:
        """Queue an error event: a stable `code`, a precise `message` and what it refers to."""
        self.errors_sent += 1
        self.event("error", code=code, message=message, **fields)

    def close(self, code: int = CLOSE_NORMAL) -> None:
        """Close after the messages already queued have gone out (idempotent)."""
        if self._close_code is None:
            self._close_code = code
            self.queue.close()

    def _count_handed(self, frame: VideoFrame) -> None:
        seg = self.director.segment_for_epoch(frame.epoch) if self.director is not None else None
        self.frames.count_handed(None if seg is None else seg.index)

    def _on_sample(self, frame: VideoFrame, encoder: Fmp4Encoder, sample: EncodedSample) -> None:
        seg = self.director.segment_for_epoch(frame.epoch) if self.director is not None else None
        meta = frame_meta(frame, self.session.clock())
        meta["segment"] = None if seg is None else seg.index
        meta["encode_ms"] = round(sample.encode_ms, 2)
        self.queue.put_media(MediaItem(sample, sample.keyframe, len(sample.data),
                                       {"encoder": encoder, "event": meta}))

    def _on_clear(self) -> None:
        self.queue.purge_media()

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

    async def _send_loop(self) -> None:
        while True:
            item = await self.queue.get()
            if isinstance(item, Close):
                await self.ws.close(self._close_code or CLOSE_NORMAL)
                return
            if isinstance(item, MediaItem):
                msgs = self.render(item)
                if msgs:
                    self.frames.count_sent(item.meta["event"].get("segment"))
                else:
                    self.frames.count_dropped("unrouted")
            else:
                msgs = item.fn() if isinstance(item, Render) else [item]
            for m in msgs:
                if isinstance(m, bytes):
                    await self.ws.send_bytes(m)
                else:
                    await self.ws.send_text(m)
                self.bytes_out += len(m)

    # -- incoming -----------------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            self.messages_in += 1
            if msg.get("bytes") is not None:
                self.on_binary(msg["bytes"])
                continue
            self.on_text(msg.get("text") or "")

    #: largest client text message, bytes (Dreamverse's is larger)
    max_text_bytes = MAX_TEXT_BYTES

    def refuse(self, code: str, message: str, outcome: str, now_s: float, *, rid: Any = None,
               **ref: Any) -> None:
        """Refuse one client message through the guard: counted toward the flood verdict, answered by a
        coalesced `error` event (the first of a quiet interval at once, the rest as one summary)."""
        self.feedback.send_all(self.guard.rejected_message("stream", code, message, now_s, outcome=outcome,
                                                            ref=ref, rid=rid))

    def _admit(self, raw: str | bytes, now_s: float) -> bool:
        """Size and rate of any client message, before it is parsed (refused ones are answered)."""
        if self.feedback.closed:
            self.guard.dropped("stream", now_s)
            return False
        rej = self.guard.admit("stream", raw, now_s, max_bytes=self.max_text_bytes)
        if rej is None:
            return True
        self.refuse("message_too_large" if rej.outcome == "too_large" else "rate_limited", rej.message,
                    rej.outcome, now_s)
        return False

    def on_binary(self, data: bytes) -> None:
        now = time.monotonic()
        if self._admit(data, now):
            self.refuse("binary_not_accepted", f"binary messages are not accepted from clients (got {len(data)} "
                        "bytes); send JSON text", "invalid", now)

    def on_text(self, text: str) -> None:
        """Dispatch one client text message (never raises for bad input).

        Every message is size- and rate-checked before it is parsed (`InputGuard.admit`, "stream"), and
        every refusal goes through the guard: one flood verdict whatever the client sends.
        """
        now = time.monotonic()
        if not self._admit(text, now):
            return
        try:
            obj = parse_json(text, what="stream", max_bytes=self.max_text_bytes)
        except RpcError as e:
            self.refuse("bad_json", e.message, "parse_error", now)
            return
        if not isinstance(obj, dict):
            self.refuse("bad_message", f"expected a JSON object, got {type(obj).__name__}", "invalid", now)
            return
        if "method" in obj:
            self._queue_control(obj)
        elif "type" in obj:
            kind = obj["type"]
            if kind == "direction":
                self._queue_control(obj)
            elif kind == "ping":
                t = obj.get("t")
                ok = isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) and abs(t) < 1e15
                self.guard.accepted("stream", now)
                self.event("pong", t=t if ok else None)  # NaN/inf (which json.loads accepts) are not echoed
            elif kind == "auth":
                self.refuse("already_authenticated", "this stream is already authenticated", "invalid", now,
                            type="auth")
            else:
                shown = kind[:64] if isinstance(kind, str) else type(kind).__name__
                self.refuse("unknown_type", f"unknown message type {shown!r}; types are {list(MESSAGE_TYPES)} "
                            "(actions and RPCs carry no type)", "invalid", now, type=shown)
        elif "seq" in obj:
            try:
                events = self.actions.receive(text, now, parsed=obj)
            except Exception:  # noqa: BLE001 - a handler bug must not end the stream
                logger.exception("%r: action handler failed", self)
                events = [{"event": "action_rejected", "seq": None, "code": errors.INTERNAL_ERROR,
                           "message": "internal error"}]
            self.feedback.send_all(events)
        else:
            self.refuse("bad_message", "expected an action {seq, t, keys, mouse}, an RPC {id, method, params} "
                        f"or a typed message {{type, ...}} with type in {list(MESSAGE_TYPES)}", "invalid", now)

    def _queue_control(self, obj: dict[str, Any], *, limited: bool = True) -> bool:
        """Queue a request for the control loop (in order; `limited`: counts against the control rate).

        Returns:
            whether it was queued (else the client was told why, through the guard).
        """
        ref, now = _ref(obj), time.monotonic()
        if limited and not self.guard.take("control", now):
            why = f"more than {self.guard.limits.control_rate_hz:g} directions/RPCs per second"
            if "method" in obj:  # an RPC: its error reply within the reply budget, else an rpc_rejected summary
                self.feedback.send_all(self.guard.rejected_control(
                    ref, Rejection(errors.RATE_LIMITED, why, "rate_limited"), now))
            else:
                self.refuse("rate_limited", why, "rate_limited", now, rid=ref, id=ref)
            return False
        try:
            self._control.put_nowait(obj)
        except asyncio.QueueFull:
            self.refuse("rate_limited", f"{MAX_PENDING_CONTROL} requests are still waiting", "rate_limited", now,
                        rid=ref, id=ref)
            return False
        return True

    async def _control_loop(self) -> None:
        while True:
            obj = await self._control.get()
            try:
                await self.handle_control(obj)
            except Exception:  # noqa: BLE001
                logger.exception("%r: control request failed", self)
                self.error("internal_error", "internal error", id=_ref(obj))

    async def handle_control(self, obj: dict[str, Any]) -> None:
        """Run one queued request (RPCs and directions here), one at a time, in arrival order."""
        if "method" in obj:
            reply = await self.rpc.handle(obj)
            if reply is not None:  # None: a JSON-RPC 2.0 notification, never answered
                self.guard.control_result(reply, time.monotonic())
                self.send_json(reply)
        else:
            await self._direct(obj)

    async def _direct(self, obj: dict[str, Any]) -> None:
        ref, now = _ref(obj), time.monotonic()
        if self.director is None:
            self.refuse("not_directing", "directions need a directing session (POST /v1/sessions with "
                        '{"mode": "directing"}); this one is interactive', "invalid", now, rid=ref, id=ref)
            return
        try:
            d = DirectionMessage.model_validate(obj)
        except ValidationError as e:
            self.refuse("bad_direction", validation_message(e), "invalid", now, rid=ref, id=ref)
            return
        self.guard.accepted("control", now)
        try:
            context = await asyncio.get_running_loop().run_in_executor(None, self.session.encode_prompt, d.prompt)
        except SessionError as e:
            self.error("bad_direction", str(e), id=ref)
            return
        self._held = []  # the ack goes first, then the segment events it caused
        try:
            ack = self.director.direct(str(d.id), d.prompt, context, duration_s=d.duration_s,
                                       open_ended=d.open_ended)
        except SessionError as e:
            self._held = None
            self.error("session_closed", str(e), id=ref)
            return
        held, self._held = self._held, None
        cut, seg_index = ack.cut, ack.segment.index
        self.send_rendered(lambda: [dumps({"event": "direction_ack", "id": d.id, "segment": seg_index,
                                           "cut": None if cut is None else self.segment_summary(cut)})])
        for text in held:
            self._put(text)

    # -- session and segment events --------------------------------------------------------------------

    def _segment_start(self, seg: Segment) -> None:
        self.event("segment_start", segment=seg.index, direction_id=seg.direction_id, prompt=seg.prompt,
                   epoch=seg.epoch, target_frames=seg.target_frames)

    def segment_summary(self, seg: Segment) -> dict[str, object]:
        """`Segment.summary` as this stream delivered it: `frames` its frames sent, `dropped` those handed to
        this stream but not sent (`FrameAccount.dropped` says where). Final once rendered after the segment's
        queued media (a cut or stopped segment's undelivered frames are stale: never sent later)."""
        assert self.director is not None
        summary = seg.summary(self.director.fps)
        summary["frames"], summary["dropped"] = self.frames.segment(seg.index)
        return summary

    def _segment_complete(self, seg: Segment) -> None:
        def enqueue() -> None:  # rendered when sent: after every media segment of it queued before
            self.send_rendered(lambda: [dumps({"event": "segment_complete", **self.segment_summary(seg)})])

        if seg.end == SegmentEnd.FINISHED:  # its last frames may still be in the encoder: after them
            self.sink.when_done(enqueue)
        else:  # cut or stopped: its queued frames were dropped
            enqueue()

    def _on_state(self, session: Session, state: object) -> None:
        assert isinstance(state, SessionState)
        self.event("state", state=state.name.lower())
        if state == SessionState.CLOSED:
            self.close(CLOSE_NORMAL)

    def _on_error(self, session: Session, reason: object) -> None:
        self.error(getattr(reason, "code", "session_failed"), str(reason))

    # -- lifecycle ---------------------------------------------------------------------------------------

    def opening(self) -> None:
        """The stream's first messages (`stream_start`)."""
        s, m = self.session, self.session.model.spec
        self.event("stream_start", protocol=PROTOCOL_VERSION, session_id=s.id, mode=s.mode, fps=m.fps,
                   frames_per_chunk=m.frames_per_chunk, model=m.name, prompt=s.prompt)

    async def run(self) -> None:
        """Serve the stream until the client leaves, the session closes or the reader stalls for good."""
        s = self.session
        self._unsubscribe += [s.on("state", self._on_state), s.on("error", self._on_error)]
        if self.director is not None:
            self._unsubscribe += [self.director.on("segment_start", self._segment_start),
                                  self.director.on("segment_complete", self._segment_complete)]
        self.opening()
        self.sink.start()
        loop = asyncio.get_running_loop()
        sender = loop.create_task(self._send_loop(), name=f"ws-send-{s.id}")
        receiver = loop.create_task(self._receive_loop(), name=f"ws-recv-{s.id}")
        self._tasks += [sender, receiver, loop.create_task(self._control_loop(), name=f"ws-control-{s.id}")]
        try:
            s.actions.new_client()
            s.attach_sink(self._tap)  # a directed session's gate lets through only its open segment's frames
            await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_COMPLETED)
            for t in (sender, receiver):
                if t.done() and not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    if not isinstance(exc, WebSocketDisconnect | RuntimeError | OSError):
                        logger.error("%r: %s failed", self, t.get_name(), exc_info=exc)
        except SessionError:
            pass  # closed while we attached
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Detach from the session and stop every task (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.feedback.close()
        for u in self._unsubscribe:
            u()
        self.session.detach_sink(self._tap)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except BaseException:  # noqa: BLE001 - cancelled or already reported
                pass
        await self.sink.aclose()
        logger.info("%r: closed (%d bytes out, %d frames in, %d sent, dropped %s; queue %s)", self, self.bytes_out,
                    self.sink.frames_in, self.frames.sent, self.frames.dropped, self.queue.stats)


class _CountingSink:
    """A `FrameSink` that counts each frame (`on_put`) before its sink takes it."""

    def __init__(self, sink: Fmp4Sink, on_put: Callable[[VideoFrame], None]) -> None:
        self.sink, self.on_put = sink, on_put

    def put(self, frame: VideoFrame) -> None:
        self.on_put(frame)
        self.sink.put(frame)

    def clear(self) -> None:
        self.sink.clear()


def _ref(obj: dict[str, Any]) -> Any:
    """The id of a request, echoed in errors when it is a plain value."""
    rid = obj.get("id", obj.get("prompt_id"))
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) and len(str(rid)) <= 128 else None


async def serve_stream(ws: WebSocket, session_id: str, *, manager: SessionManager,
                       streams: dict[str, StreamConnection], video_scale: int,
                       make_guard: Callable[[], InputGuard] = InputGuard,
                       on_frames: Callable[[str, int], None] | None = None) -> None:
    """Serve GET /v1/sessions/{id}/stream: authenticate, refuse a second stream, run the connection."""
    session = await authenticate(ws, manager, session_id)
    if session is None:
        return
    deadline = time.monotonic() + BUSY_GRACE_S
    while session.id in streams and time.monotonic() < deadline:  # a stream just closed may still be ending
        await asyncio.sleep(0.01)
    if session.id in streams:
        await reject(ws, "stream_busy", "this session already has a stream; close it first", CLOSE_BUSY)
        return
    if "worldcast.transport" not in (ws.scope.get("extensions") or {}):
        logger.info("Session(%s): no unsent-bytes limit on the stream's socket (StreamSocketTuning); slow "
                    "readers are noticed only once the kernel's send buffer fills", session.id)
    conn = StreamConnection(ws, session, video_scale=video_scale, guard=make_guard(), on_frames=on_frames)
    streams[session.id] = conn
    try:
        await conn.run()
    finally:
        if streams.get(session.id) is conn:
            del streams[session.id]
