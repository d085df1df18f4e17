"""WebRTC adapter (aiortc): a session's video track and its data channels.

A protocol translation over the connection core (`connection.Connection`: guard, feedback, action and
RPC dispatch, the frame event, the close): data channel messages in, control-channel JSON out, and the
RTCPeerConnection's own teardown.

- `WebRTCPeer` answers an SDP offer, publishes the session's video track
  (`video_track.SessionVideoTrack`, the `FrameSink`, re-exported here), and
  serves the client's data channels: `actions` (may be unordered/unreliable;
  see `schemas.ActionMessage`; each message goes to `Connection.take_action`)
  and `control` (reliable; RPCs in, and out: replies, feedback, the session's
  state and the frame event of each frame delivered to the track). Every way
  it can end closes its RTCPeerConnection: a negotiation that does not reach
  `connected` within `negotiation_timeout_s`, a failed or closed connection,
  its session closing, a flood verdict (`transport/limits.py`), an error
  while answering, or `aclose()`.
- The ICE settings (`ice.py`: `configure_ice`, `quiet_closed_transport_errors`)
  live beside it and are re-exported here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from worldcast.sessions.frames import VideoFrame
from worldcast.sessions.session import Session, SessionState
from worldcast.transport.connection import Connection, frame_event
from worldcast.transport.connection import retrieve as _retrieve
from worldcast.transport.limits import InputGuard, InputLimits, head_id
from worldcast.transport.rpc import Settle
from worldcast.transport.webrtc.ice import (  # noqa: F401 - configure_ice, quiet_closed_transport_errors re-exported
    close_peer_connection,
    configure_ice,
    quiet_closed_transport_errors,
)
from worldcast.transport.webrtc.video_track import SessionVideoTrack

logger = logging.getLogger(__name__)

#: Control RPCs per second a client may send, and the burst: `InputLimits`' defaults (other transports import these).
CONTROL_RATE_HZ = InputLimits().control_rate_hz
CONTROL_BURST = InputLimits().control_burst
#: Default time an answered peer has to reach `connected` before it is closed, s. ICE over a
#: real network with relays takes a few seconds; a client that never applies the answer, never more.
NEGOTIATION_TIMEOUT_S = 15.0
#: Longest a disconnect waits for its reason event to reach the client (acknowledged by its SCTP), s.
DISCONNECT_FLUSH_S = 3.0



def _sctp_unacknowledged(pc: RTCPeerConnection) -> bool:
    """Whether `pc`'s SCTP association still holds data chunks it has not sent or the peer has not
    acknowledged (aiortc's private queues; False where aiortc does not have them)."""
    sctp = pc.sctp
    return sctp is not None and bool(getattr(sctp, "_outbound_queue", None) or getattr(sctp, "_sent_queue", None))


class WebRTCPeer:
    """One client's peer connection to a session.

    Args:
        session: the session it serves.
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
        self.track = SessionVideoTrack(session.frames.is_current, scale=video_scale, stamp=session.stamp_frames)
        #: the connection core: guard, feedback, action and RPC dispatch, tasks, the close
        self.conn = Connection(session, send=self.send_event, on_flood=self._flood,
                               guard=InputGuard(limits, on_count=on_count), settle=settle or self.track.settle,
                               name="webrtc")
        self.guard = self.conn.guard
        self.close_reason: str | None = None
        self.closed = self.conn.closed  #: set once the peer is closed
        self.connected = asyncio.Event()
        self._control: Any = None
        self._on_closed = on_closed
        self._on_connected = on_connected
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
                self.session.sink_connected(self.track)  # a viewer now: it holds the session's slot
                if self._on_connected is not None and not self.conn.closing:
                    self._on_connected(self)
            elif state in ("failed", "closed"):
                self._spawn(self.aclose(state))

    def __repr__(self) -> str:
        return f"WebRTCPeer({self.session.id}, {self.pc.connectionState})"

    def _spawn(self, coro: Any) -> None:
        self.conn.spawn(coro)

    def send_event(self, event: dict[str, Any]) -> None:
        """Send a server event (or reply) on the control channel, if open."""
        ch = self._control
        if ch is not None and ch.readyState == "open":
            ch.send(json.dumps(event, separators=(",", ":"), ensure_ascii=False))

    def _flood(self, verdict: dict[str, Any]) -> None:
        """The guard's verdict was sent: close once the control channel has sent it."""
        logger.warning("%r: disconnecting: %s", self.session, verdict["message"])
        self._spawn(self._disconnect("flood"))

    async def _disconnect(self, reason: str) -> None:
        """Close once the client has the reason event, bounded by `DISCONNECT_FLUSH_S`.

        A data channel's `bufferedAmount` falling to 0 only means its messages reached the SCTP
        association's queues, not the peer: closing the peer connection aborts the association
        (an SCTP ABORT, RFC 9260 section 9.1) and drops what is still unsent or unacknowledged, which under a
        flood from the client is often the reason event itself. So wait for the association's send and
        retransmission queues to empty as well (aiortc keeps them as `_outbound_queue` and `_sent_queue`;
        without them, only `bufferedAmount` is waited for).
        """
        ch, deadline = self._control, time.monotonic() + DISCONNECT_FLUSH_S
        while ch is not None and ch.readyState == "open" and time.monotonic() < deadline \
                and (ch.bufferedAmount > 0 or _sctp_unacknowledged(self.pc)):
            await asyncio.sleep(0.01)
        await self.aclose(reason)

    def _on_action(self, message: str | bytes) -> None:
        now = time.monotonic()
        if not self.conn.silenced("actions", now):
            self.conn.take_action(message, now)

    def _on_control(self, message: str | bytes) -> None:
        now = time.monotonic()
        rej = self.guard.admit("control", message, now)
        if rej is not None:  # refused before parsing: answered (or summarised) without a task
            self.conn.feedback.send_all(self.guard.rejected_control(head_id(message), rej, now))
            return
        self._spawn(self._run_control(message, now))

    async def _run_control(self, message: str | bytes, now_s: float) -> None:
        reply = await self.conn.call(message, now_s, raw=True, max_bytes=self.guard.limits.max_control_bytes)
        if reply is not None:
            self.send_event(reply)
        self.conn.feedback.send_all([])

    def _on_frame(self, session: Session, frame: object) -> None:
        assert isinstance(frame, VideoFrame)
        self.send_event(frame_event(frame, session.clock()))

    def _control_handed_over(self, session: Session, to: object) -> None:
        """Control was handed over (`Session.hand_over`): this peer was its controller's, so it closes (the new
        controller negotiates its own)."""
        self.send_event({"event": "error", "code": "control_handed_over",
                         "message": f"control was handed to {'the owner' if to is None else 'viewer ' + str(to)}"})
        self._spawn(self.aclose("control_handed_over"))

    def _on_session_state(self, session: Session, state: object) -> None:
        self.send_event({"event": "state", "state": state.name.lower()})  # type: ignore[attr-defined]
        if state == SessionState.CLOSED:
            self._spawn(self.aclose("session_closed"))

    async def answer(self, offer_sdp: str) -> RTCSessionDescription:
        """Apply the client's offer, start the negotiation timer, attach the track to the session,
        and return our answer (ICE gathering complete).

        Validate the offer first (`transport/webrtc/sdp.py`): this only reports what aiortc refuses.

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
            # a connecting viewer: it holds the session until its negotiation timeout, no longer
            self.session.attach_sink(self.track, connect_by_s=self.session.clock() + self.negotiation_timeout_s)
            # (SessionClosedError if a DELETE won the race)
            self.conn.subscribe(
                self.session.on("frame", self._on_frame),
                self.session.on("error", lambda s, r: self.send_event(
                    {"event": "error", "code": getattr(r, "code", "session_failed"), "message": str(r)})),
                self.session.on("state", self._on_session_state),
                self.session.on("control", self._control_handed_over))
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
        first = not self.conn.closing
        if first:
            self.close_reason = reason
        try:
            await self.conn.aclose(sink=self.track, after=self._release)
        finally:
            if first and self._on_closed is not None:
                self._on_closed(self)

    async def _release(self) -> None:
        """The WebRTC part of the close: stop the track, close the RTCPeerConnection."""
        self.track.stop()
        await close_peer_connection(self.pc)
