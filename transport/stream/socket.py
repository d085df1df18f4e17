"""The fMP4 WebSocket of one session, protocol-neutral: media out, text in, one control loop, one close.

Two protocols run over it, each by composition (a `StreamProtocol` handed to `StreamSocket`, never a
subclass): the worldcast stream (`connection.StreamConnection`, docs/streaming.md) and Dreamverse's `/ws`
(`transport/dreamverse/connection.DreamverseConnection`). The socket owns what both share:

- video: the session's frames through a `_CountingSink` into the fMP4 sink (`fmp4.Fmp4Sink`, over the session's
  one shared encode, `fmp4.SessionEncode`;
  frames counted per directing segment in `queue.FrameAccount`), then `queue.OutboundQueue` (media
  dropped for a reader that stops reading, control text never), rendered by the protocol at send time;
- input: every client message size- and rate-checked by the connection core's guard before it is parsed
  (`admit`), binary refused, text handed to the protocol; requests queued for one control loop that runs
  them in arrival order (`queue_control`), at most `MAX_PENDING_CONTROL` waiting;
- the close: `close(code)` closes after what is queued; `aclose` is the core's close (cancel and await
  every task, detach, unsubscribe), then the encoder's;
- spectators (`spectator=True`, a viewer's read-only stream): attached as the session's spectator
  (`Session.attach_spectator`: it neither wakes the session nor holds it open, and starts no new client
  numbering), and dropped when one send has waited `stall_s` (a reader that stopped reading), checked as each
  encoded frame arrives.

Event-loop only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

from worldcast.sessions.directing import Segment, director_of
from worldcast.sessions.errors import SessionError
from worldcast.sessions.frames import VideoFrame
from worldcast.sessions.session import Session
from worldcast.transport import errors
from worldcast.transport.connection import Connection, frame_fields
from worldcast.transport.errors import QueueOverflow, RpcError
from worldcast.transport.limits import Rejection
from worldcast.transport.rpc import parse_json
from worldcast.transport.schemas import MAX_CONTROL_BYTES
from worldcast.transport.stream.fmp4 import EncodedSample, Fmp4Encoder, Fmp4Sink
from worldcast.transport.stream.queue import Close, FrameAccount, MediaItem, OutboundQueue, Render

logger = logging.getLogger(__name__)

#: Control requests (RPCs, directions) waiting to run, at most.
MAX_PENDING_CONTROL = 32
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_INTERNAL = 1000, 1008, 1011
#: What `StreamSocket.read` returns for a message it refused.
REFUSED = object()


def dumps(obj: Any) -> str:
    """Compact JSON text, no NaN or infinity (RFC 8259 has none)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def request_ref(obj: dict[str, Any]) -> Any:
    """The id of a request, echoed in errors when it is a plain value (a str or int of at most 128 characters)."""
    rid = obj.get("id", obj.get("prompt_id"))
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) and len(str(rid)) <= 128 else None


class StreamProtocol(Protocol):
    """One wire protocol over a `StreamSocket`: the translation of client text and session events."""

    def opening(self) -> None:
        """Queue the stream's first messages."""

    def on_text(self, text: str) -> None:
        """Dispatch one client text message (never raises for bad input)."""

    def render(self, item: MediaItem) -> list[str | bytes]:
        """The messages of one media item, at send time ([] : not routed, counted dropped)."""

    async def handle_control(self, obj: dict[str, Any]) -> None:
        """Run one queued request."""

    def error(self, code: str, message: str, **fields: Any) -> None:
        """Queue an error in this protocol's shape."""

    def on_state(self, session: Session, state: object) -> None: ...

    def on_error(self, session: Session, reason: object) -> None: ...

    def on_control(self, session: Session, to: object) -> None: ...

    def segment_start(self, seg: Segment) -> None: ...

    def segment_complete(self, seg: Segment) -> None: ...


class StreamSocket:
    """The socket, video pipeline and control loop of one session's stream.

    Args:
        ws: the accepted, authenticated socket.
        session: its session.
        protocol: the wire protocol spoken on it.
        conn: the connection core (guard, feedback, tasks, the close).
        video_scale: integer upscale of the video.
        max_text_bytes: largest client message, bytes.
        on_frames: called with (outcome, frames) for every frame handed to the stream: "sent" or
            "dropped_<reason>" (`FrameAccount`; the metrics' `on_stream_frames`).
        spectator: a viewer's read-only stream (see the module docstring).
        stall_s: a spectator whose one send has waited this long is dropped, s (None: never).

    Attributes:
        frames: what became of every frame handed to the stream (`FrameAccount`).
    """

    def __init__(self, ws: WebSocket, session: Session, protocol: StreamProtocol, conn: Connection, *,
                 video_scale: int = 1, max_text_bytes: int = MAX_CONTROL_BYTES,
                 on_frames: Callable[[str, int], None] | None = None, spectator: bool = False,
                 stall_s: float | None = None) -> None:
        self.ws, self.session, self.protocol, self.conn = ws, session, protocol, conn
        self.spectator, self.stall_s = spectator, stall_s
        self._sending_since_s: float | None = None  #: when the send in flight began (None: none)
        self._sender: asyncio.Task[None] | None = None
        self.director = director_of(session)  #: the directing layer over the session (None: interactive)
        self.max_text_bytes = max_text_bytes
        self.frames = FrameAccount(on_count=on_frames)
        self.sink = Fmp4Sink(session.frames, fps=session.model.spec.fps, on_sample=self._on_sample,
                             on_clear=self._on_clear, scale=video_scale,
                             stamp=session.stamp_frames,
                             depth=max(2, session.model.spec.frames_per_chunk), name=session.id,
                             on_drop=self.frames.count_dropped)
        self.queue = OutboundQueue(on_need_keyframe=self.sink.request_keyframe, on_drop=self.frames.count_dropped)
        self.tap = _CountingSink(self.sink, self._count_handed)  #: what the session delivers to
        self._control: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_PENDING_CONTROL)
        self._held: list[str | Render] | None = None  #: events held back (`hold`)
        self._close_code: int | None = None
        self._aborted = False  #: the connection was dropped (a reader that stopped reading)
        self.messages_in = 0
        self.bytes_out = 0
        #: the asyncio transport under the socket (None: unknown server), for `write_buffer_bytes`
        self.transport = (ws.scope.get("extensions") or {}).get("worldcast.transport")

    @property
    def write_buffer_bytes(self) -> int:
        """Bytes accepted for sending but not yet handed to the kernel (the transport's buffer)."""
        return int(self.transport.get_write_buffer_size()) if self.transport is not None else 0

    # -- outgoing -----------------------------------------------------------------------------------

    def send_json(self, obj: dict[str, Any]) -> None:
        """Queue a JSON message (never dropped); an event (`"event"` key) waits while events are held."""
        text = dumps(obj)
        if self._held is not None and "event" in obj:
            self._held.append(text)
            return
        self.put(text)

    def send_rendered(self, fn: Callable[[], list[str | bytes]]) -> None:
        """Queue messages rendered when they are sent (held like events)."""
        if self._held is not None:
            self._held.append(Render(fn))
            return
        self.put(Render(fn))

    def hold(self) -> None:
        """Hold events back (until `release`): a reply goes out before the events its request caused."""
        self._held = []

    def release(self) -> list[str | Render]:
        """Stop holding; returns what was held, for the caller to `put` after its reply."""
        held, self._held = self._held or [], None
        return held

    def put(self, text: str | Render) -> None:
        """Queue one control message (closes the connection if the reader stopped reading)."""
        if self._aborted:
            return
        try:
            self.queue.put_control(text)
        except QueueOverflow as e:
            # the reader is not reading: a close frame would wait behind what it never reads, so drop
            # the connection now (its run loop then detaches the sink and ends)
            logger.warning("%r: %s; dropping the connection", self.protocol, e)
            self._aborted = True
            self.close(CLOSE_POLICY)
            if self.transport is not None:
                self.transport.abort()

    def close(self, code: int = CLOSE_NORMAL) -> None:
        """Close after the messages already queued have gone out (idempotent)."""
        if self._close_code is None:
            self._close_code = code
            self.queue.close()

    def segment_of(self, frame: VideoFrame) -> int | None:
        """The directing segment a frame belongs to (None: interactive, or none)."""
        seg = self.director.segment_for_epoch(frame.epoch) if self.director is not None else None
        return None if seg is None else seg.index

    def _count_handed(self, frame: VideoFrame) -> None:
        self.frames.count_handed(self.segment_of(frame))

    def _stalled(self) -> bool:
        """Whether this spectator's reader has taken nothing for `stall_s` (one send waiting that long)."""
        since = self._sending_since_s
        return self.stall_s is not None and since is not None and time.monotonic() - since > self.stall_s

    def drop(self, why: str) -> None:
        """Drop the connection now, without a close handshake (which would wait behind what is never read)."""
        if self._aborted:
            return
        logger.warning("%r: %s; dropping the connection", self.protocol, why)
        self._aborted = True
        self.close(CLOSE_POLICY)
        if self.transport is not None:
            self.transport.abort()
        if self._sender is not None:
            self._sender.cancel()  # run() then closes: detach, release

    def _on_sample(self, frame: VideoFrame, encoder: Fmp4Encoder, sample: EncodedSample) -> None:
        if self.spectator and self._stalled():
            self.drop(f"the spectator's reader took nothing for {self.stall_s:g} s")
            return
        meta = frame_fields(frame, self.session.clock())
        meta["segment"] = self.segment_of(frame)
        meta["encode_ms"] = round(sample.encode_ms, 2)
        self.queue.put_media(MediaItem(sample, sample.keyframe, len(sample.data),
                                       {"encoder": encoder, "event": meta}))

    def _on_clear(self) -> None:
        self.queue.purge_media()

    async def _send_loop(self) -> None:
        while True:
            item = await self.queue.get()
            if isinstance(item, Close):
                await self.ws.close(self._close_code or CLOSE_NORMAL)
                return
            if isinstance(item, MediaItem):
                msgs = self.protocol.render(item)
                if msgs:
                    self.frames.count_sent(item.meta["event"].get("segment"))
                else:
                    self.frames.count_dropped("unrouted")
            else:
                msgs = item.fn() if isinstance(item, Render) else [item]
            for m in msgs:
                self._sending_since_s = time.monotonic()
                if isinstance(m, bytes):
                    await self.ws.send_bytes(m)
                else:
                    await self.ws.send_text(m)
                self._sending_since_s = None
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
            self.protocol.on_text(msg.get("text") or "")

    def refuse(self, code: str, message: str, outcome: str, now_s: float, *, rid: Any = None, **ref: Any) -> None:
        """Refuse one client message through the guard (`Connection.refuse` on the "stream" channel)."""
        self.conn.refuse("stream", code, message, outcome, now_s, rid=rid, **ref)

    def admit(self, raw: str | bytes, now_s: float) -> bool:
        """Size and rate of any client message, before it is parsed (refused ones are answered)."""
        if self.conn.silenced("stream", now_s):
            return False
        rej = self.conn.guard.admit("stream", raw, now_s, max_bytes=self.max_text_bytes)
        if rej is None:
            return True
        self.refuse("message_too_large" if rej.outcome == "too_large" else "rate_limited", rej.message,
                    rej.outcome, now_s)
        return False

    def read(self, text: str, now_s: float, *, what: str) -> Any:
        """Admit (`admit`) and decode one client text message; `REFUSED` if it was refused (and answered)."""
        if not self.admit(text, now_s):
            return REFUSED
        try:
            return parse_json(text, what=what, max_bytes=self.max_text_bytes)
        except RpcError as e:
            self.refuse("bad_json", e.message, "parse_error", now_s)
            return REFUSED

    def on_binary(self, data: bytes) -> None:
        now = time.monotonic()
        if self.admit(data, now):
            self.refuse("binary_not_accepted", f"binary messages are not accepted from clients (got {len(data)} "
                        "bytes); send JSON text", "invalid", now)

    def queue_control(self, obj: dict[str, Any], *, limited: bool = True) -> bool:
        """Queue a request for the control loop (in order; `limited`: counts against the control rate).

        Returns:
            whether it was queued (else the client was told why, through the guard).
        """
        ref, guard, now_s = request_ref(obj), self.conn.guard, time.monotonic()
        if limited and not guard.take("control", now_s):
            why = f"more than {guard.limits.control_rate_hz:g} directions/RPCs per second"
            if "method" in obj:  # an RPC: its error reply within the reply budget, else an rpc_rejected summary
                self.conn.feedback.send_all(guard.rejected_control(
                    ref, Rejection(errors.RATE_LIMITED, why, "rate_limited"), now_s))
            else:
                self.refuse("rate_limited", why, "rate_limited", now_s, rid=ref, id=ref)
            return False
        try:
            self._control.put_nowait(obj)
        except asyncio.QueueFull:
            self.refuse("rate_limited", f"{MAX_PENDING_CONTROL} requests are still waiting", "rate_limited", now_s,
                        rid=ref, id=ref)
            return False
        return True

    async def _control_loop(self) -> None:
        while True:
            obj = await self._control.get()
            try:
                await self.protocol.handle_control(obj)
            except Exception:  # noqa: BLE001
                logger.exception("%r: control request failed", self.protocol)
                self.protocol.error("internal_error", "internal error", id=request_ref(obj))

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the stream until the client leaves, the session closes or the reader stalls for good."""
        s, p, conn = self.session, self.protocol, self.conn
        conn.subscribe(s.on("state", p.on_state), s.on("error", p.on_error), s.on("control", p.on_control))
        if self.director is not None:
            conn.subscribe(self.director.on("segment_start", p.segment_start),
                           self.director.on("segment_complete", p.segment_complete))
        p.opening()
        self.sink.start()
        sender = self._sender = conn.spawn(self._send_loop(), name=f"ws-send-{s.id}")
        receiver = conn.spawn(self._receive_loop(), name=f"ws-recv-{s.id}")
        conn.spawn(self._control_loop(), name=f"ws-control-{s.id}")
        try:
            assert sender is not None and receiver is not None, "run() on a closed stream"
            if self.spectator:  # watches only: no client numbering, no wake-up, no hold on the session
                s.attach_spectator(self.tap)
            else:
                s.inputs.new_client()
                s.attach_sink(self.tap)  # a directed session's gate lets through only its open segment's frames
            await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_COMPLETED)
            for t in (sender, receiver):
                if t.done() and not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    if not isinstance(exc, WebSocketDisconnect | RuntimeError | OSError):
                        logger.error("%r: %s failed", p, t.get_name(), exc_info=exc)
        except SessionError:
            pass  # closed while we attached
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """The core's close (detach, unsubscribe, cancel and await every task), then the encoder's (idempotent)."""
        await self.conn.aclose(sink=self.tap, after=self._finish)

    async def _finish(self) -> None:
        await self.sink.aclose()
        logger.info("%r: closed (%d bytes out, %d frames in, %d sent, dropped %s; queue %s)", self.protocol,
                    self.bytes_out, self.sink.frames_in, self.frames.sent, self.frames.dropped, self.queue.stats)


class _CountingSink:
    """A `FrameSink` that counts each frame (`on_put`) before its sink takes it."""

    def __init__(self, sink: Fmp4Sink, on_put: Callable[[VideoFrame], None]) -> None:
        self.sink, self.on_put = sink, on_put

    def put(self, frame: VideoFrame) -> None:
        self.on_put(frame)
        self.sink.put(frame)

    def clear(self) -> None:
        self.sink.clear()
