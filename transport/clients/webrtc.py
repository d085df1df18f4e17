"""A Python client for worldcast sessions over WebRTC (aiortc), for tests and benchmarks.

(The WebSocket stream client, `StreamClient`, is in `stream.py`; both are exported by `worldcast.transport.clients`.)

    async with await WebRTCClient.connect("http://127.0.0.1:8000", prompt="a snowy landscape") as c:
        frame = await c.next_frame()          # av.VideoFrame
        c.send_action(keys=["d"])             # hold D
        await c.rpc("flush")

The client offers a recvonly video transceiver and two data channels
(`actions`: unordered, no retransmits; `control`: reliable), waits for ICE
gathering (no trickle), and posts the offer. Control replies resolve the
futures returned by `rpc`; server events are kept in `events`.

It sends UTF-8 JSON (not ASCII-escaped) and checks each message against the
server's size limits before sending (`MessageTooLarge`, nothing sent). Every
call ends as soon as its outcome is known: its reply, an `rpc_rejected`
summary naming its id (rate-limited past the server's reply budget), or the
control channel closing (`ConnectionError`); `RPC_TIMEOUT_S` only bounds a
server that says nothing.

aiortc's video jitter buffer hands a frame to the decoder only when the
first packet of the *next* frame arrives, which adds one frame period of
latency that browsers do not have (libwebrtc completes a frame at the RTP
marker bit, set on a frame's last packet; RFC 3550 5.1, RFC 7741 4.1). The
client swaps in `MarkerJitterBuffer`, which does the same, so latency
measured with it is what a browser would see.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any

import av
import httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.utils import uint16_add

from worldcast.transport.clients.errors import MessageTooLarge, RpcFailed
from worldcast.transport.clients.session_api import (
    EventWaiters,
    action_message,
    check_rpc_payload,
    create_session,
    next_seq,
    remember_sent,
)
from worldcast.transport.limits import head_id
from worldcast.transport.schemas import MAX_CONTROL_BYTES, MAX_MESSAGE_BYTES

#: How long to wait for a control reply, s.
RPC_TIMEOUT_S = 10.0
#: How long to wait for the data channels to open after the answer, s.
CONNECT_TIMEOUT_S = 20.0


def encode_message(obj: Any, *, what: str, limit_bytes: int) -> str:
    """Serialise `obj` as compact UTF-8 JSON and check its size, as the server counts it.

    Raises:
        MessageTooLarge: over `limit_bytes` bytes.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > limit_bytes:
        raise MessageTooLarge(what, size, limit_bytes)
    return text


class MarkerJitterBuffer(JitterBuffer):
    """A video jitter buffer that completes a frame at its RTP marker bit (RFC 3550 5.1).

    When the packets from the buffer's origin are contiguous, share one
    timestamp and end with a marker, they are a whole frame: it is released
    at once. Otherwise (a packet lost or reordered) aiortc's rule applies:
    a frame is complete when a packet of a later timestamp follows it.
    """

    def __init__(self, capacity: int, prefetch: int = 0, is_video: bool = False) -> None:
        super().__init__(capacity, prefetch=prefetch, is_video=is_video)
        #: (RTP timestamp, client monotonic s) of the last frames released to the decoder
        self.released: deque[tuple[int, float]] = deque(maxlen=4096)

    def add(self, packet: Any) -> tuple[bool, JitterFrame | None]:
        pli, frame = super().add(packet)
        if frame is not None:
            self.released.append((frame.timestamp, time.monotonic()))
        return pli, frame

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        if self._origin is not None:
            packets: list[Any] = []
            for count in range(self._capacity):
                p = self._packets[uint16_add(self._origin, count) % self._capacity]
                if p is None or (packets and p.timestamp != packets[0].timestamp):
                    break
                packets.append(p)
                if p.marker:
                    frame = JitterFrame(data=b"".join(x._data for x in packets), timestamp=p.timestamp)  # type: ignore[attr-defined]
                    self.remove(count + 1)
                    return frame
        return super()._remove_frame(sequence_number)


class WebRTCClient:
    """One session over one peer connection. Create with `connect`."""

    def __init__(self, base_url: str, session_id: str, token: str, model: dict[str, Any], *,
                 marker_frames: bool = True) -> None:
        self.base_url = base_url
        self.session_id = session_id
        self.token = token
        self.model = model
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.http = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        self.actions = self.pc.createDataChannel("actions", ordered=False, maxRetransmits=0)
        self.control = self.pc.createDataChannel("control")
        video = self.pc.addTransceiver("video", direction="recvonly")
        self.jitter_buffer: MarkerJitterBuffer | None = None
        if marker_frames and hasattr(video.receiver, "_RTCRtpReceiver__jitter_buffer"):  # see the module docstring
            self.jitter_buffer = MarkerJitterBuffer(capacity=512, is_video=True)
            video.receiver._RTCRtpReceiver__jitter_buffer = self.jitter_buffer
        self.events: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.frame_events: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.seq = -1
        self.sent_at: dict[int, float] = {}
        self._track: Any = None
        self._track_ready = asyncio.Event()
        self._rpc_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._event_waiters = EventWaiters()
        self.control.on("message", self._on_control)
        self.control.on("close", lambda: self._fail_pending("the control channel closed"))

        @self.pc.on("connectionstatechange")
        def _on_state() -> None:
            if self.pc.connectionState in ("failed", "closed"):
                self._fail_pending(f"the peer connection is {self.pc.connectionState}")

        @self.pc.on("track")
        def _on_track(track: Any) -> None:
            self._track = track
            self._track_ready.set()

    @classmethod
    async def connect(
        cls, base_url: str, *, prompt: str | None = None, seed: int | None = None, stamp_frames: bool = False,
        image: bytes | None = None, marker_frames: bool = True,
    ) -> WebRTCClient:
        """Create a session and connect to it.

        Args:
            image: a PNG or JPEG file, the starting image of a model that takes one.
            stamp_frames: ask the server to stamp frame index and action seq into the video
                (read them with `transport.media.stamp.read_stamp`).
            marker_frames: complete video frames at the RTP marker bit, as browsers do
                (False: aiortc's own jitter buffer, one frame period later).

        Raises:
            httpx.HTTPStatusError: session creation or signaling was refused.
            TimeoutError: the data channels did not open in time.
        """
        info = await create_session(base_url, prompt=prompt, seed=seed, stamp_frames=stamp_frames, image=image)
        self = cls(base_url, info["session_id"], info["token"], info["model"], marker_frames=marker_frames)
        try:
            await self._negotiate()
        except BaseException:
            await self.aclose(delete=True)
            raise
        return self

    async def _negotiate(self) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())  # aiortc gathers before returning
        r = await self.http.post(
            f"/v1/sessions/{self.session_id}/webrtc",
            json={"sdp": self.pc.localDescription.sdp, "type": "offer"},
        )
        r.raise_for_status()
        self.answered_at = time.monotonic()
        await self.pc.setRemoteDescription(RTCSessionDescription(**r.json()))
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while self.control.readyState != "open" or self.actions.readyState != "open":
            if time.monotonic() > deadline:
                raise TimeoutError("data channels did not open")
            await asyncio.sleep(0.01)

    # -- control -------------------------------------------------------------------------

    def _fail_pending(self, why: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(why))
        self._pending.clear()

    def _resolve(self, rid: Any, reply: dict[str, Any]) -> None:
        fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def _on_control(self, message: str | bytes) -> None:
        msg = json.loads(message)
        msg["received_at"] = time.monotonic()
        if "event" in msg:
            (self.frame_events if msg["event"] == "frame" else self.events).append(msg)
            if msg["event"] == "rpc_rejected":  # refused past the reply budget: those calls fail now
                for rid in msg.get("ids", []):
                    self._resolve(rid, {"id": rid, "error": {"code": msg["code"], "message": msg["message"]}})
            elif msg["event"] == "disconnect":
                self._fail_pending(f"the server disconnected this client: {msg.get('message')}")
            self._event_waiters.notify(msg)
            return
        self._resolve(msg.get("id"), msg)

    async def rpc(self, method: str, params: dict[str, Any] | None = None, *,
                  raw: Any = None) -> dict[str, Any] | None:
        """Call a control RPC and return its result.

        Args:
            raw: send this exact payload instead of a well-formed request (for error tests; a str
                or bytes goes out as it is, unchecked); its reply is returned whole. A JSON-RPC 2.0
                notification (`"jsonrpc": "2.0"` and no `id`) is sent and None returned at once: the
                server never answers one.

        Raises:
            RpcFailed: the server answered with an error.
            MessageTooLarge: the request is over the server's control message limit (not sent).
            ValueError: `raw` is a batch (a JSON array): the server refuses them (not sent).
            ConnectionError: the control channel closed before the reply.
            TimeoutError: no reply within RPC_TIMEOUT_S.
        """
        if self.control.readyState != "open":
            raise ConnectionError(f"the control channel is {self.control.readyState}")
        self._rpc_id += 1
        rid = self._rpc_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if raw is not None:
            notification = check_rpc_payload(raw)
            key = raw.get("id") if isinstance(raw, dict) else head_id(raw)
            payload = raw if isinstance(raw, str | bytes) else encode_message(
                raw, what="control", limit_bytes=10 * MAX_CONTROL_BYTES)
            if notification:
                self.control.send(payload)
                return None
            self._pending[key] = fut  # type: ignore[index]
            self.control.send(payload)
            return await asyncio.wait_for(fut, RPC_TIMEOUT_S)
        text = encode_message({"id": rid, "method": method, "params": params or {}}, what="control",
                              limit_bytes=MAX_CONTROL_BYTES)
        self._pending[rid] = fut
        self.control.send(text)
        reply = await asyncio.wait_for(fut, RPC_TIMEOUT_S)
        if "error" in reply:
            raise RpcFailed(reply["error"]["code"], reply["error"]["message"])
        return reply["result"]

    async def wait_event(self, predicate: Any, timeout_s: float = 10.0) -> dict[str, Any]:
        """Wait for the next server event (or frame event) matching `predicate`."""
        return await self._event_waiters.wait(predicate, timeout_s)

    # -- actions and frames -------------------------------------------------------------

    def send_action(self, keys: list[str] | None = None, mouse: tuple[float, float] = (0, 0),
                    axes: dict[str, float] | None = None) -> int:
        """Send one action message; returns its seq.

        Args:
            keys: keys held now, from the model's declared action space (`model["actions"]["keys"]`).
            mouse: (dx, dy) mouse counts since the previous message (ignored by a model without mouse axes).
            axes: the model's axes by name (`model["actions"]["axes"]`; see `session_api.action_message`).

        Raises:
            UnknownKey: a key or axis the model does not declare (not sent, seq not used).
            TypeError, ValueError: keys not a list of names, a mouse movement or axis value not finite or out of
                range.
            MessageTooLarge: over the server's action message limit (not sent, seq not used).
        """
        now = time.monotonic()
        seq = next_seq(self.seq)  # restarts at 0 before the server's limit (2**53)
        text = encode_message(action_message(self.model, seq, now, keys, mouse, axes),
                              what="action", limit_bytes=MAX_MESSAGE_BYTES)
        self.seq = seq
        remember_sent(self.sent_at, seq, now)
        self.actions.send(text)
        return self.seq

    def send_raw_action(self, payload: str | bytes) -> None:
        self.actions.send(payload)

    async def next_frame(self, timeout_s: float = 10.0) -> av.VideoFrame:
        """The next decoded video frame from the track."""
        await asyncio.wait_for(self._track_ready.wait(), timeout_s)
        return await asyncio.wait_for(self._track.recv(), timeout_s)

    # -- teardown -------------------------------------------------------------------------------

    async def aclose(self, *, delete: bool = True) -> None:
        """Close the peer connection and (by default) delete the session (idempotent)."""
        if delete:
            try:
                await self.http.delete(f"/v1/sessions/{self.session_id}")
            except httpx.HTTPError:
                pass
        await self.pc.close()
        await self.http.aclose()

    async def __aenter__(self) -> WebRTCClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
