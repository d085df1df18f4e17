"""WebRTC edge (aiortc): a session's video track and its data channels.

- `SessionVideoTrack` is a `FrameSink`: it holds at most two frames (the
  oldest is dropped, never delayed) and hands them to aiortc's encoder with
  the session's 90 kHz PTS (RFC 3551 video clock), optionally scaled up.
- `WebRTCPeer` answers an SDP offer, publishes the track, and serves the
  client's data channels: `actions` (may be unordered/unreliable; see
  `schemas.ActionMessage`) and `control` (reliable; RPCs and server events).
- `configure_ice` pins the host addresses aioice gathers ICE candidates on;
  by default aioice skips loopback, so a server bound to 127.0.0.1 (and every
  test) pins 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aioice.ice
import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from worldcast.sessions.session import Session, VideoFrame
from worldcast.transport.errors import INTERNAL_ERROR, RATE_LIMITED
from worldcast.transport.rpc import ActionHandler, RpcHandler, TokenBucket
from worldcast.transport.stamp import cell_px_for_width, write_stamp

logger = logging.getLogger(__name__)

_original_get_host_addresses = aioice.ice.get_host_addresses

#: Control RPCs per second a client may send (bursts of CONTROL_BURST); each may embed a prompt.
CONTROL_RATE_HZ = 10.0
CONTROL_BURST = 20.0


def configure_ice(host_addresses: list[str] | None) -> None:
    """Gather host ICE candidates only on `host_addresses` (None: aioice's default, all but loopback).

    Process-wide: aioice looks host addresses up through a module function.
    """
    if host_addresses:
        addrs = list(host_addresses)
        v4 = [a for a in addrs if ":" not in a]
        v6 = [a for a in addrs if ":" in a]

        def _pinned(use_ipv4: bool, use_ipv6: bool) -> list[str]:
            return (v4 if use_ipv4 else []) + (v6 if use_ipv6 else [])

        aioice.ice.get_host_addresses = _pinned
    else:
        aioice.ice.get_host_addresses = _original_get_host_addresses


class SessionVideoTrack(MediaStreamTrack):
    """A video track fed by a session: a frame sink of depth `depth` (1 or 2).

    Args:
        epoch_fn: the session's current flush epoch; frames of older epochs are dropped at `recv`.
        scale: integer upscale factor applied before encoding (1 = model resolution).
        depth: frames held at most.
        stamp: stamp each frame's index and applied action seq into its bottom rows, after
            upscaling (`transport/stamp.py`; for latency measurement).
    """

    kind = "video"

    def __init__(self, epoch_fn: Callable[[], int], *, scale: int = 1, depth: int = 2, stamp: bool = False) -> None:
        super().__init__()
        self.stamp = stamp
        self._queue: collections.deque[VideoFrame] = collections.deque(maxlen=depth)
        self._ready = asyncio.Event()
        self._epoch_fn = epoch_fn
        self.scale = scale
        self.frames_in = 0
        self.frames_out = 0
        self.frames_dropped = 0
        self.last_pts = -1

    def put(self, frame: VideoFrame) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.frames_dropped += 1
        self._queue.append(frame)
        self.frames_in += 1
        self._ready.set()

    def clear(self) -> None:
        self.frames_dropped += len(self._queue)
        self._queue.clear()
        self._ready.clear()

    async def recv(self) -> av.VideoFrame:
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            while not self._queue:
                self._ready.clear()
                await self._ready.wait()
                if self.readyState != "live":
                    raise MediaStreamError
            f = self._queue.popleft()
            if f.epoch >= self._epoch_fn() and f.pts > self.last_pts:
                break
            self.frames_dropped += 1
        if self.stamp:  # upscale first so the code's cells keep their size in the video
            image = f.image if self.scale == 1 else f.image.repeat(self.scale, 0).repeat(self.scale, 1)
            cell = cell_px_for_width(image.shape[1])
            out = av.VideoFrame.from_ndarray(write_stamp(image, f.frame_index, f.action_seq, cell_px=cell),
                                             format="rgb24").reformat(format="yuv420p")
        else:
            h, w = f.image.shape[:2]
            out = av.VideoFrame.from_ndarray(f.image, format="rgb24").reformat(
                width=w * self.scale, height=h * self.scale, format="yuv420p",
                interpolation="BILINEAR" if self.scale > 1 else None)
        out.pts, out.time_base = f.pts, f.time_base
        self.last_pts = f.pts
        self.frames_out += 1
        return out


class WebRTCPeer:
    """One client's peer connection to a session.

    Args:
        session: the session it serves.
        encode_prompt: for `set_prompt` RPCs.
        video_scale: integer upscale of the published video.
        on_closed: called once when the connection ends.
    """

    def __init__(
        self,
        session: Session,
        *,
        encode_prompt: Callable[[str], Any],
        video_scale: int = 1,
        on_closed: Callable[[WebRTCPeer], None] | None = None,
    ) -> None:
        self.session = session
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = SessionVideoTrack(session.current_epoch, scale=video_scale, stamp=session.stamp_frames)
        self.rpc = RpcHandler(session, encode_prompt)
        self.actions = ActionHandler(session)
        self.control_bucket = TokenBucket(CONTROL_RATE_HZ, CONTROL_BURST)
        self._control: Any = None
        self._on_closed = on_closed
        self._closed = False
        self._unsubscribe: list[Callable[[], None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.pc.addTrack(self.track)

        @self.pc.on("datachannel")
        def _on_datachannel(channel: Any) -> None:
            if channel.label == "actions":
                channel.on("message", lambda m: self._on_action(m))
            elif channel.label == "control":
                self._control = channel
                channel.on("message", lambda m: self._spawn(self._on_control(m)))
            else:
                logger.info("%r: ignoring data channel %r", session, channel.label)

        @self.pc.on("connectionstatechange")
        async def _on_state() -> None:
            logger.info("%r: peer connection %s", session, self.pc.connectionState)
            if self.pc.connectionState in ("failed", "closed"):
                await self.aclose()

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro, name=f"webrtc-{self.session.id}")
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def send_event(self, event: dict[str, Any]) -> None:
        """Send a server event on the control channel, if open."""
        ch = self._control
        if ch is not None and ch.readyState == "open":
            ch.send(json.dumps(event, separators=(",", ":")))

    def _on_action(self, message: str | bytes) -> None:
        try:
            err = self.actions.handle_raw(message)
        except Exception:  # noqa: BLE001 - never let a message break aiortc's receive loop
            logger.exception("%r: action handler failed", self.session)
            err = {"event": "action_rejected", "seq": None, "code": INTERNAL_ERROR, "message": "internal error"}
        if err is not None:
            self.send_event(err)

    async def _on_control(self, message: str | bytes) -> None:
        if not self.control_bucket.take(time.monotonic()):
            rid = None
            with contextlib.suppress(Exception):  # best effort: answer with the request's id
                req = json.loads(message)
                rid = req.get("id") if isinstance(req, dict) else None
            self.send_event({"id": rid, "error": {"code": RATE_LIMITED, "message": "too many control messages"}})
            return
        try:
            reply = await self.rpc.handle_raw(message)
        except Exception:  # noqa: BLE001
            logger.exception("%r: control handler failed", self.session)
            reply = {"id": None, "error": {"code": INTERNAL_ERROR, "message": "internal error"}}
        self.send_event(reply)

    def _on_frame(self, session: Session, frame: object) -> None:
        assert isinstance(frame, VideoFrame)
        self.send_event({
            "event": "frame",
            "frame_index": frame.frame_index,
            "pts": frame.pts,
            "action_seq": frame.action_seq,
            "epoch": frame.epoch,
            "lateness_ms": round((session.clock() - frame.present_at_s) * 1e3, 2),
            "timings_ms": {k: round(v, 2) for k, v in frame.timings_ms.items()},
        })

    async def answer(self, offer_sdp: str) -> RTCSessionDescription:
        """Apply the client's offer and return our answer (ICE gathering complete).

        Raises:
            ValueError: the SDP cannot be parsed or negotiated (the peer is closed).
        """
        if "\nm=video" not in "\n" + offer_sdp.replace("\r\n", "\n"):
            await self.aclose()
            raise ValueError("invalid SDP offer: no video m-line (offer a recvonly video transceiver)")
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except Exception as e:
            await self.aclose()
            raise ValueError(f"invalid SDP offer: {e}") from e
        self.session.actions.new_client()
        self.session.attach_sink(self.track)
        self._unsubscribe.append(self.session.on("frame", self._on_frame))
        self._unsubscribe.append(self.session.on("error", lambda s, r: self.send_event(
            {"event": "error", "code": "session_failed", "message": str(r)})))
        self._unsubscribe.append(self.session.on("state", lambda s, st: self.send_event(
            {"event": "state", "state": st.name.lower()})))  # type: ignore[attr-defined]
        return self.pc.localDescription

    async def aclose(self) -> None:
        """Close the connection and detach from the session (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for u in self._unsubscribe:
            u()
        self.session.detach_sink(self.track)
        self.track.stop()
        for t in list(self._tasks):
            t.cancel()
        await self.pc.close()
        if self._on_closed is not None:
            self._on_closed(self)
