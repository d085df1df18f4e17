"""A Python client for a session's WebSocket stream (fMP4 over WebSocket), for tests, benchmarks and the CLI.

    async with await StreamClient.connect("http://127.0.0.1:8000", mode="directing") as c:
        ack = await c.direct("a snowy field", duration_s=5)   # the direction's ack event
        async for f in c.frames():                            # decoded frames with their metadata
            print(f.frame_index, f.segment, f.image.shape)

The client creates a session (or attaches to one), opens
`/v1/sessions/{id}/stream` with the token in the Authorization header (or in
a first auth message), reads the JSON events and the fMP4 byte stream, and
decodes each media segment's H.264 sample with PyAV as soon as it arrives
(decoder in low-delay mode, one thread: no frame held back). Protocol:
docs/streaming.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO, Any, Literal

import av
import httpx
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from worldcast.transport.clients.errors import StreamError
from worldcast.transport.clients.session_api import (
    EventWaiters,
    action_message,
    check_rpc_payload,
    create_session,
    delete_session,
    next_seq,
    remember_sent,
)
from worldcast.transport.limits import head_id
from worldcast.transport.stream.mp4box import parse_init, parse_media_segment

#: How long to wait for an RPC reply or a direction's ack, s.
REPLY_TIMEOUT_S = 10.0
#: Decoded frames kept for a consumer that falls behind (the oldest go first).
MAX_BUFFERED_FRAMES = 2000


@dataclass
class StreamFrame:
    """One decoded frame and what the server said about it.

    Attributes:
        frame: the decoded picture (yuv420p).
        frame_index, pts, action_seq, epoch: as in the `media` event (pts: session PTS, 90 kHz).
        segment: the directing segment it belongs to (None: interactive session).
        keyframe: whether its media segment was an IDR.
        decode_time: its start in the fMP4 timeline, timescale units.
        received_s: client monotonic time its media segment arrived, s.
        decoded_s: client monotonic time it was decoded, s.
        event: the whole media event.
    """

    frame: av.VideoFrame
    frame_index: int
    pts: int
    action_seq: int
    epoch: int
    segment: int | None
    keyframe: bool
    decode_time: int
    received_s: float
    decoded_s: float
    event: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def image(self) -> np.ndarray:
        """uint8 (H, W, 3) RGB."""
        return self.frame.to_ndarray(format="rgb24")

    @property
    def luma(self) -> np.ndarray:
        """uint8 (H, W): the Y plane."""
        return self.frame.to_ndarray(format="gray")


class StreamClient:
    """One session's WebSocket stream. Create with `connect` (new session) or `attach` (existing one).

    Attributes:
        events: every JSON event received (with `received_s`), oldest first.
        init_segment: the init segment (None before it arrives); `mime` its MIME type.
        opened_s: client monotonic time the stream opened (its `stream_start` arrived), s.
    """

    def __init__(self, base_url: str, session_id: str, token: str, model: dict[str, Any], ws: ClientConnection, *,
                 decode: bool = True, record: IO[bytes] | None = None) -> None:
        self.base_url, self.session_id, self.token, self.model = base_url, session_id, token, model
        self.ws, self.decode, self.record = ws, decode, record
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)
        self.init_segment: bytes | None = None
        self.mime: str | None = None
        self.opened_s: float | None = None
        self.seq = -1
        self.sent_at: dict[int, float] = {}
        self.bytes_in = 0
        self.media_segments = 0
        self._frames: asyncio.Queue[StreamFrame | None] = asyncio.Queue()
        self._decoder: av.CodecContext | None = None
        self._pending_media: dict[str, Any] | None = None
        self._expect_init = False
        self._rpc_id = 0
        self._direction_id = 0
        self._pending: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self._waiters = EventWaiters()
        self._opened = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"stream-client-{session_id}")
        self.closed_code: int | None = None

    # -- opening -------------------------------------------------------------------------------------

    @classmethod
    async def connect(cls, base_url: str, *, mode: Literal["interactive", "directing"] = "interactive",
                      prompt: str | None = None, seed: int | None = None, stamp_frames: bool = False,
                      image: bytes | None = None, **kw: Any) -> StreamClient:
        """Create a session and open its stream (see `attach` for the keyword arguments).

        Raises:
            httpx.HTTPStatusError: session creation refused (503 with Retry-After when full).
            StreamError: the stream was refused.
        """
        info = await create_session(base_url, prompt=prompt, seed=seed, stamp_frames=stamp_frames, mode=mode,
                                    image=image)
        try:
            return await cls.attach(base_url, info["session_id"], info["token"], model=info["model"], **kw)
        except BaseException:
            await delete_session(base_url, info["session_id"], info["token"])
            raise

    @classmethod
    async def attach(cls, base_url: str, session_id: str, token: str, *, model: dict[str, Any] | None = None,
                     auth: Literal["header", "message"] = "header", decode: bool = True,
                     record: IO[bytes] | None = None, open_timeout_s: float = 30.0,
                     **ws_options: Any) -> StreamClient:
        """Open the stream of an existing session.

        Args:
            auth: send the token in the Authorization header, or in a first auth message (as browsers must).
            decode: decode frames (False: keep only events and bytes).
            record: write the fMP4 byte stream (init segment and media segments) here as it arrives.
            ws_options: passed to `websockets.asyncio.client.connect` (e.g. max_queue).

        Raises:
            StreamError: the server refused the stream (its error event).
            TimeoutError: no `stream_start` within `open_timeout_s`.
        """
        ws_url = "ws" + base_url.removeprefix("http") + f"/v1/sessions/{session_id}/stream"
        headers = {"Authorization": f"Bearer {token}"} if auth == "header" else {}
        ws = await connect(ws_url, additional_headers=headers, compression=None, max_size=2**24,
                           open_timeout=open_timeout_s, **ws_options)
        if auth == "message":
            await ws.send(json.dumps({"type": "auth", "token": token}))
        self = cls(base_url, session_id, token, model or {}, ws, decode=decode, record=record)
        done, _ = await asyncio.wait([asyncio.ensure_future(self._opened.wait()), self._reader],
                                     timeout=open_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if not self._opened.is_set():
            err = next((e for e in self.events if e.get("event") == "error"), None)
            await self.aclose(delete=False)
            if err is not None:
                raise StreamError(err["code"], err["message"], err)
            raise TimeoutError(f"stream of {session_id} did not start within {open_timeout_s:g} s")
        return self

    # -- reading ---------------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                now = time.monotonic()
                if isinstance(msg, bytes):
                    self._on_binary(msg, now)
                else:
                    self._on_text(msg, now)
        except ConnectionClosed:
            pass
        finally:
            self.closed_code = self.ws.close_code
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(f"stream closed ({self.closed_code})"))
            self._frames.put_nowait(None)

    def _on_text(self, text: str, now: float) -> None:
        msg = json.loads(text)
        msg["received_s"] = now
        if "event" not in msg:  # an RPC reply
            fut = self._pending.pop(("rpc", msg.get("id")), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        self.events.append(msg)
        kind = msg["event"]
        if kind == "stream_start":
            self.opened_s = now
            self._opened.set()
        elif kind == "media_init":
            self.mime, self._expect_init = msg["mime"], True
        elif kind == "media":
            self._pending_media = msg
        elif kind == "direction_ack" or (kind == "error" and msg.get("id") is not None):
            fut = self._pending.pop(("direction", msg.get("id")), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        if kind == "error" and msg.get("ids"):  # a summary of refused requests: those calls end now
            for rid in msg["ids"]:
                fut = self._pending.pop(("direction", rid), None)
                if fut is not None and not fut.done():
                    fut.set_result(dict(msg, id=rid))
        elif kind == "rpc_rejected":
            for rid in msg.get("ids", []):
                fut = self._pending.pop(("rpc", rid), None)
                if fut is not None and not fut.done():
                    fut.set_result({"id": rid, "error": {"code": msg["code"], "message": msg["message"]}})
        self._waiters.notify(msg)

    def _on_binary(self, data: bytes, now: float) -> None:
        self.bytes_in += len(data)
        if self.record is not None:
            self.record.write(data)
        if self._expect_init:
            self._expect_init = False
            self.init_segment = data
            if self.decode:
                info = parse_init(data)
                self._decoder = av.CodecContext.create("h264", "r")
                self._decoder.extradata = info.avcc  # length-prefixed samples (14496-15)
                self._decoder.thread_count = 1  # frame threads would hold frames back
                self._decoder.flags |= av.codec.context.Flags.low_delay
            return
        self.media_segments += 1
        meta, self._pending_media = self._pending_media or {}, None
        if self._decoder is None:
            return
        seg = parse_media_segment(data)
        for sample in seg.samples:
            for pic in self._decoder.decode(av.Packet(sample.data)):
                f = StreamFrame(pic, meta.get("frame_index", -1), meta.get("pts", -1), meta.get("action_seq", -1),
                                meta.get("epoch", -1), meta.get("segment"), sample.sync, seg.base_decode_time,
                                now, time.monotonic(), meta)
                if self._frames.qsize() >= MAX_BUFFERED_FRAMES:
                    self._frames.get_nowait()
                self._frames.put_nowait(f)

    async def next_frame(self, timeout_s: float = 10.0) -> StreamFrame:
        """The next decoded frame.

        Raises:
            TimeoutError: none within `timeout_s`.
            ConnectionError: the stream closed.
        """
        f = await asyncio.wait_for(self._frames.get(), timeout_s)
        if f is None:
            self._frames.put_nowait(None)
            raise ConnectionError(f"stream closed ({self.closed_code})")
        return f

    async def frames(self) -> AsyncIterator[StreamFrame]:
        """Decoded frames as they arrive, until the stream closes."""
        while True:
            f = await self._frames.get()
            if f is None:
                self._frames.put_nowait(None)
                return
            yield f

    def frames_waiting(self) -> int:
        return self._frames.qsize()

    async def wait_event(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 10.0,
                         *, past: bool = False) -> dict[str, Any]:
        """The next event matching `predicate` (with `past`: also one already received)."""
        if past:
            for e in self.events:
                if predicate(e):
                    return e
        return await self._waiters.wait(predicate, timeout_s)

    # -- sending ---------------------------------------------------------------------------------------

    async def send_raw(self, payload: str | bytes) -> None:
        """Send a message as is (for error tests)."""
        await self.ws.send(payload)

    async def send_action(self, keys: list[str] | None = None, mouse: tuple[float, float] = (0, 0),
                          axes: dict[str, float] | None = None) -> int:
        """Send one action message (the data channel's schema, `session_api.action_message`); returns its seq.

        Raises:
            UnknownKey: a key or axis outside the model's declared action space (nothing sent).
        """
        now = time.monotonic()
        msg = action_message(self.model or {}, next_seq(self.seq), now, keys, mouse, axes)
        self.seq = msg["seq"]  # restarts at 0 before the server's limit (2**53)
        remember_sent(self.sent_at, self.seq, now)
        await self.ws.send(json.dumps(msg))
        return self.seq

    async def rpc(self, method: str, params: dict[str, Any] | None = None, *,
                  raw: Any = None) -> dict[str, Any] | None:
        """Call a control RPC on the stream and return its result.

        Args:
            raw: send this request object (or text) instead of a well-formed one; its reply is returned
                whole. A JSON-RPC 2.0 notification (`"jsonrpc": "2.0"`, no `id`) is sent and None
                returned at once (the server never answers one).

        Raises:
            StreamError: the server answered with an error (code: the JSON-RPC code).
            ValueError: `raw` is a batch (a JSON array): the server refuses them (not sent).
            ConnectionError: the stream closed before the reply.
        """
        if raw is not None:
            notification = check_rpc_payload(raw)
            text = raw if isinstance(raw, str | bytes) else json.dumps(raw)
            if notification:
                await self.ws.send(text)
                return None
            key = raw.get("id") if isinstance(raw, dict) else head_id(raw)
            fut_raw: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._pending[("rpc", key)] = fut_raw
            await self.ws.send(text)
            return await asyncio.wait_for(fut_raw, REPLY_TIMEOUT_S)
        self._rpc_id += 1
        rid = self._rpc_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[("rpc", rid)] = fut
        await self.ws.send(json.dumps({"id": rid, "method": method, "params": params or {}}))
        reply = await asyncio.wait_for(fut, REPLY_TIMEOUT_S)
        if "error" in reply:
            raise StreamError(reply["error"]["code"], reply["error"]["message"], reply)
        return reply["result"]  # type: ignore[no-any-return]

    async def send_direction(self, prompt: str, *, duration_s: float | None = None, open_ended: bool = False,
                             direction_id: str | None = None, from_segment: int | None = None,
                             ) -> tuple[str, asyncio.Future[dict[str, Any]], float]:
        """Send a direction without waiting; returns (its id, a future of its ack or error event, sent at s).
        `from_segment` N takes segment N again, from where it began (docs/streaming.md)."""
        if direction_id is None:
            self._direction_id += 1
            direction_id = f"d{self._direction_id}"
        msg: dict[str, Any] = {"type": "direction", "id": direction_id, "prompt": prompt}
        if open_ended:
            msg["duration_s"] = None
        elif duration_s is not None:
            msg["duration_s"] = duration_s
        if from_segment is not None:
            msg["from_segment"] = from_segment
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[("direction", direction_id)] = fut
        sent = time.monotonic()
        await self.ws.send(json.dumps(msg))
        return direction_id, fut, sent

    async def direct(self, prompt: str, *, duration_s: float | None = None, open_ended: bool = False,
                     direction_id: str | None = None, from_segment: int | None = None) -> dict[str, Any]:
        """Send a direction and wait for its `direction_ack` event.

        Raises:
            StreamError: the server refused it (its error event).
        """
        _, fut, _ = await self.send_direction(prompt, duration_s=duration_s, open_ended=open_ended,
                                              direction_id=direction_id, from_segment=from_segment)
        ack = await asyncio.wait_for(fut, REPLY_TIMEOUT_S)
        if ack["event"] == "error":
            raise StreamError(ack["code"], ack["message"], ack)
        return ack

    # -- teardown ----------------------------------------------------------------------------------------

    async def aclose(self, *, delete: bool = True) -> None:
        """Close the stream and (by default) delete the session (idempotent)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5.0)
        self._reader.cancel()
        await asyncio.wait({self._reader}, timeout=2.0)
        if delete:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=10) as http:
                with contextlib.suppress(httpx.HTTPError):
                    await http.delete(f"/v1/sessions/{self.session_id}",
                                      headers={"Authorization": f"Bearer {self.token}"})

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
