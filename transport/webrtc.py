"""WebRTC edge (aiortc): a session's video track and its data channels.

- `SessionVideoTrack` is a `FrameSink`: it holds at most two frames (the
  oldest is dropped, never delayed) and hands them to aiortc's encoder with
  the session's 90 kHz PTS (RFC 3551 video clock), optionally scaled up.
- `WebRTCPeer` answers an SDP offer, publishes the track, and serves the
  client's data channels: `actions` (may be unordered/unreliable; see
  `schemas.ActionMessage`) and `control` (reliable; RPCs and server events).
  Every way it can end closes its RTCPeerConnection: a negotiation that does
  not reach `connected` within `negotiation_timeout_s`, a failed or closed
  connection, its session closing, a flood verdict (`transport/limits.py`), an
  error while answering, or `aclose()`.
- `configure_ice` pins the host addresses aioice gathers ICE candidates on;
  by default aioice skips loopback, so a server bound to 127.0.0.1 (and every
  test) pins 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aioice.ice
import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from worldcast.sessions.session import Session, SessionState, VideoFrame
from worldcast.transport.errors import INTERNAL_ERROR
from worldcast.transport.frame_queue import FrameQueue
from worldcast.transport.limits import InputGuard, InputLimits, head_id
from worldcast.transport.rpc import ActionHandler, RpcHandler, Settle
from worldcast.transport.stamp import cell_px_for_width, write_stamp

logger = logging.getLogger(__name__)

_original_get_host_addresses = aioice.ice.get_host_addresses

#: Control RPCs per second a client may send, and the burst: `InputLimits`' defaults (other transports import these).
CONTROL_RATE_HZ = InputLimits().control_rate_hz
CONTROL_BURST = InputLimits().control_burst
#: Default time an answered peer has to reach `connected` before it is closed, s. ICE over a
#: real network with relays takes a few seconds; a client that never applies the answer, never more.
NEGOTIATION_TIMEOUT_S = 15.0
#: Longest a flush or cancel reply waits for aiortc's sender to finish sending a frame it holds, s
#: (one VP8 encode plus its packets take milliseconds; this bounds a sender that never comes back).
SETTLE_TIMEOUT_S = 1.0
#: Longest a disconnect waits for its reason event to leave the control channel, s.
DISCONNECT_FLUSH_S = 1.0


#: aioice's consent freshness defaults (RFC 7675 5.1: a check every 5 s, consent lost after 30 s).
_CONSENT_DEFAULTS = (aioice.ice.CONSENT_INTERVAL, aioice.ice.CONSENT_FAILURES)


def configure_ice(host_addresses: list[str] | None, *, consent_timeout_s: float | None = None) -> None:
    """Gather host ICE candidates only on `host_addresses` (None: aioice's default, all but loopback), and
    end a connection whose peer stopped answering ICE consent checks after about `consent_timeout_s`
    (None: RFC 7675's 30 s). A client that vanishes without closing (a killed process, a lost network)
    is noticed this way.

    Process-wide: aioice reads host addresses and consent timing from its module.
    """
    if consent_timeout_s is None:
        aioice.ice.CONSENT_INTERVAL, aioice.ice.CONSENT_FAILURES = _CONSENT_DEFAULTS
    else:
        interval = min(5.0, consent_timeout_s / 3)  # at least 3 checks before giving up
        aioice.ice.CONSENT_INTERVAL = interval  # type: ignore[assignment]  # a float works: it feeds asyncio.sleep
        aioice.ice.CONSENT_FAILURES = max(1, round(consent_timeout_s / interval))
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

    aiortc's sender calls `recv`, encodes the frame it gets (in a thread), sends
    all of that frame's RTP packets, and only then calls `recv` again: between
    the two the frame is in the sender's hands. `settle(epoch)` waits until no
    frame older than `epoch` is there, so a flush reply sent after it is
    followed by no older-epoch video (bar RTP retransmissions of packets sent
    before it, on loss).

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
        self.queue = FrameQueue(depth, epoch_fn)
        self._epoch_fn = epoch_fn
        self.scale = scale
        self.frames_out = 0
        self.last_pts = -1
        self._out_epoch: int | None = None  #: epoch of the frame the sender holds (None: none)
        self._sender_back = asyncio.Event()
        self._sender_back.set()

    def put(self, frame: VideoFrame) -> None:
        self.queue.put(frame)

    def clear(self) -> None:
        self.queue.clear()

    @property
    def frames_in(self) -> int:
        return self.queue.frames_in

    @property
    def frames_dropped(self) -> int:
        return self.queue.frames_dropped

    def stop(self) -> None:
        super().stop()
        self.queue.wake()  # a pending recv ends with MediaStreamError
        self._sender_back.set()

    async def settle(self, epoch: int, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
        """Wait until the sender holds no frame older than `epoch` (the frame it holds is then sent).

        Returns:
            False if the sender did not come back within `timeout_s`, s.
        """
        if self._out_epoch is None or self._out_epoch >= epoch or self.readyState != "live":
            return True
        try:
            await asyncio.wait_for(self._sender_back.wait(), timeout_s)
        except TimeoutError:
            logger.warning("SessionVideoTrack: sender held an epoch-%s frame for over %.1f s", self._out_epoch,
                           timeout_s)
            return False
        return True

    async def recv(self) -> av.VideoFrame:
        self._out_epoch = None  # the sender is back: the previous frame's packets are all sent
        self._sender_back.set()
        f = await self.queue.get(alive=lambda: self.readyState == "live", accept=lambda f: f.pts > self.last_pts)
        if f is None:
            raise MediaStreamError
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
        self._out_epoch = f.epoch  # no await from the epoch check to here: a flush cannot slip between
        self._sender_back.clear()
        return out


def quiet_closed_transport_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log aiortc's fire-and-forget tasks that fail because their transport already closed at INFO.

    aiortc starts some tasks with `ensure_future` and never awaits them (SCTP retransmissions, DTLS and
    ICE starts); when the peer has gone, they end in ConnectionError or InvalidStateError, which asyncio
    would report as "Task exception was never retrieved". Every other unhandled exception still goes to
    the loop's previous handler.
    """
    from aiortc.exceptions import InvalidStateError

    previous = loop.get_exception_handler()

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc, task = context.get("exception"), context.get("future")
        coro = getattr(task, "get_coro", lambda: None)()
        module = getattr(getattr(coro, "cr_code", None), "co_filename", "")
        if isinstance(exc, ConnectionError | InvalidStateError) and ("/aiortc/" in module or "/aioice/" in module):
            logger.info("aiortc task %s ended after its transport closed: %r", getattr(coro, "__qualname__", "?"),
                        exc)
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


async def close_peer_connection(pc: RTCPeerConnection) -> None:
    """`pc.close()`, and if aiortc fails half-way (it can, for a peer an odd offer left half-configured),
    stop its ICE transports anyway so their sockets are released; never raises."""
    try:
        await pc.close()
        return
    except Exception as e:  # noqa: BLE001
        logger.info("RTCPeerConnection.close failed (%r); stopping its ICE transports", e)
    for t in list(getattr(pc, "_RTCPeerConnection__iceTransports", ())):  # aiortc keeps them privately
        try:
            await t.stop()
        except Exception as e:  # noqa: BLE001
            logger.info("RTCIceTransport.stop failed: %r", e)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Done-callback for aiortc's own tasks: retrieve their exception so it is logged once, not lost."""
    if not task.cancelled() and task.exception() is not None:
        logger.info("aiortc task %s ended: %r", task.get_name(), task.exception())


class WebRTCPeer:
    """One client's peer connection to a session.

    Args:
        session: the session it serves.
        encode_prompt: for `set_prompt` RPCs.
        video_scale: integer upscale of the published video.
        on_closed: called once when the connection ends, with the peer (its `close_reason` set).
        on_connected: called once when the connection reaches `connected`.
        settle: for flush/cancel replies (default: this peer's track only).
        limits: per-connection input limits.
        negotiation_timeout_s: time from the answer to `connected` before the peer is closed, s.
        on_count: metrics hook of its `InputGuard`.
    """

    def __init__(
        self,
        session: Session,
        *,
        encode_prompt: Callable[[str], Any],
        video_scale: int = 1,
        on_closed: Callable[[WebRTCPeer], None] | None = None,
        on_connected: Callable[[WebRTCPeer], None] | None = None,
        settle: Settle | None = None,
        limits: InputLimits | None = None,
        negotiation_timeout_s: float = NEGOTIATION_TIMEOUT_S,
        on_count: Callable[[str, str, int], None] | None = None,
    ) -> None:
        self.session = session
        self.negotiation_timeout_s = negotiation_timeout_s
        self.track = SessionVideoTrack(session.current_epoch, scale=video_scale, stamp=session.stamp_frames)
        self.guard = InputGuard(limits, on_count=on_count)
        self.rpc = RpcHandler(session, encode_prompt, settle=settle or self.track.settle)
        self.actions = ActionHandler(session, guard=self.guard)
        self.close_reason: str | None = None
        self.closed = asyncio.Event()
        self.connected = asyncio.Event()
        self._control: Any = None
        self._on_closed = on_closed
        self._on_connected = on_connected
        self._closing = False
        self._closing_soon = False  #: a disconnect is under way
        self._drain_handle: asyncio.TimerHandle | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # from here on, every path ends in aclose()
        self.pc.addTrack(self.track)

        @self.pc.on("datachannel")
        def _on_datachannel(channel: Any) -> None:
            if channel.label == "actions":
                channel.on("message", self._on_action)
            elif channel.label == "control":
                self._control = channel
                channel.on("message", self._on_control)
            else:
                logger.info("%r: ignoring data channel %r", session, channel.label[:64])

        @self.pc.on("connectionstatechange")
        def _on_state() -> None:
            state = self.pc.connectionState
            logger.info("%r: peer connection %s", session, state)
            if state == "connected" and not self.connected.is_set():
                self.connected.set()
                if self._on_connected is not None and not self._closing:
                    self._on_connected(self)
            elif state in ("failed", "closed"):
                self._spawn(self.aclose(state))

    def __repr__(self) -> str:
        return f"WebRTCPeer({self.session.id}, {self.pc.connectionState})"

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro, name=f"webrtc-{self.session.id}")
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        t.add_done_callback(_retrieve)

    def send_event(self, event: dict[str, Any]) -> None:
        """Send a server event (or reply) on the control channel, if open."""
        ch = self._control
        if ch is not None and ch.readyState == "open":
            ch.send(json.dumps(event, separators=(",", ":"), ensure_ascii=False))

    def _send_all(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            self.send_event(ev)
        self._after_input()

    def _after_input(self) -> None:
        """Arm the summary timer; disconnect a flooder."""
        verdict = self.guard.verdict()
        if verdict is not None and not self._closing and not self._closing_soon:
            logger.warning("%r: disconnecting: %s", self.session, verdict["message"])
            for ev in self.guard.drain(float("inf")):
                self.send_event(ev)
            self.send_event(verdict)
            self._closing_soon = True  # now, not when the task runs: one verdict, one event
            self._spawn(self._disconnect("flood"))
            return
        due = self.guard.next_drain_s
        if due is not None and self._drain_handle is None and not self._closing:
            loop = asyncio.get_running_loop()
            self._drain_handle = loop.call_later(max(0.0, due - time.monotonic()), self._drain)

    async def _disconnect(self, reason: str) -> None:
        """Close after the control channel has sent what is queued (the reason event), bounded."""
        ch, deadline = self._control, time.monotonic() + DISCONNECT_FLUSH_S
        while ch is not None and ch.readyState == "open" and ch.bufferedAmount > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.aclose(reason)

    def _drain(self) -> None:
        self._drain_handle = None
        if self._closing:
            return
        self._send_all(self.guard.drain(time.monotonic()))

    def _on_action(self, message: str | bytes) -> None:
        if self._closing_soon:
            return
        try:
            events = self.actions.receive(message, time.monotonic())
        except Exception:  # noqa: BLE001 - never let a message break aiortc's receive loop
            logger.exception("%r: action handler failed", self.session)
            events = [{"event": "action_rejected", "seq": None, "code": INTERNAL_ERROR, "message": "internal error"}]
        if events or self.guard.next_drain_s is not None:
            self._send_all(events)

    def _on_control(self, message: str | bytes) -> None:
        now = time.monotonic()
        rej = self.guard.admit("control", message, now)
        if rej is not None:  # refused before parsing: answered (or summarised) without a task
            self._send_all(self.guard.rejected_control(head_id(message), rej, now))
            return
        self._spawn(self._run_control(message, now))

    async def _run_control(self, message: str | bytes, now_s: float) -> None:
        try:
            reply = await self.rpc.handle_raw(message, max_bytes=self.guard.limits.max_control_bytes)
        except Exception:  # noqa: BLE001
            logger.exception("%r: control handler failed", self.session)
            reply = {"id": head_id(message), "error": {"code": INTERNAL_ERROR, "message": "internal error"}}
        if reply is not None:
            self.guard.control_result(reply, now_s)
            self.send_event(reply)
        self._after_input()

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

    def _on_session_state(self, session: Session, state: object) -> None:
        self.send_event({"event": "state", "state": state.name.lower()})  # type: ignore[attr-defined]
        if state == SessionState.CLOSED:
            self._spawn(self.aclose("session_closed"))

    async def answer(self, offer_sdp: str) -> RTCSessionDescription:
        """Apply the client's offer, start the negotiation timer, attach the track to the session,
        and return our answer (ICE gathering complete).

        Validate the offer first (`transport/sdp.py`): this only reports what aiortc refuses.

        Raises:
            ValueError: aiortc cannot negotiate the SDP (the peer is closed).
            SessionClosedError: the session closed meanwhile (the peer is closed).
        """
        before = asyncio.all_tasks()
        try:
            try:
                await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
                await self.pc.setLocalDescription(await self.pc.createAnswer())
            except Exception as e:
                raise ValueError(f"invalid SDP offer: {e}") from e
            finally:
                for t in asyncio.all_tasks() - before:  # aiortc's connect task, and the like
                    t.add_done_callback(_retrieve)
            self.session.attach_sink(self.track)  # SessionClosedError if a DELETE won the race
            self._unsubscribe.append(self.session.on("frame", self._on_frame))
            self._unsubscribe.append(self.session.on("error", lambda s, r: self.send_event(
                {"event": "error", "code": "session_failed", "message": str(r)})))
            self._unsubscribe.append(self.session.on("state", self._on_session_state))
            self._spawn(self._negotiation_timer())
        except BaseException:
            await self.aclose("answer_failed")
            raise
        return self.pc.localDescription

    async def _negotiation_timer(self) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), self.negotiation_timeout_s)
        except TimeoutError:
            logger.info("%r: not connected %.1f s after the answer: closing", self.session,
                        self.negotiation_timeout_s)
            await self.aclose("negotiation_timeout")

    async def aclose(self, reason: str = "closed") -> None:
        """Close the connection and detach from the session (idempotent); `closed` is set when done."""
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.close_reason = reason
        if self._drain_handle is not None:
            self._drain_handle.cancel()
        try:
            for u in self._unsubscribe:
                u()
            self.session.detach_sink(self.track)
            self.track.stop()
            current = asyncio.current_task()
            for t in list(self._tasks):
                if t is not current:
                    t.cancel()
            await close_peer_connection(self.pc)
        finally:
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self)
