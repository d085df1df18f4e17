"""WHEP egress (WebRTC-HTTP Egress Protocol, draft-ietf-wish-whep): a session's video to any standard player.

A WHEP player POSTs an SDP offer; the server answers with its SDP answer and a WHEP *resource* (one player's
peer connection, `WhepPeer`), which the player DELETEs to leave. The HTTP side is
`transport/http/routes/whep.py`; this module holds the peers and their registry (`WhepResources`).

A WHEP peer is a spectator (`sessions/viewers.py`): view only, admitted against the spectator caps, closed
when its viewer token is revoked or runs out, or when the session closes. It has no data channels (one the
offer asks for is negotiated and then ignored: nothing a player sends reaches the session), and it is one
more sink of the session's frame pipeline, attached with `Session.attach_spectator` so that it neither wakes
the session nor holds it open. Its video is the session's one H.264 encode (`encoded_track.py`
`EncodedVideoTrack` over `SessionEncode`, shared with the session's other WHEP peers, fMP4 streams and
recording: aiortc only packetizes it) when the peer negotiates H.264, which the answer prefers whenever the
offer has it (`SHARED_CODEC`); a peer that offers only VP8 gets the per-peer path a controller's peer has
(`video_track.py` `SessionVideoTrack`: aiortc encodes that peer's video itself). Both carry the session's
90 kHz PTS. A peer's PLI or FIR asks the shared encode for an IDR (rate limited for all its receivers,
`transport/media/keyframes.py`); aiortc calls its sender's `_send_keyframe` for both (aiortc 1.16
`rtcrtpsender.py` `_handle_rtcp_packet`), which only concerns pictures aiortc encodes, so a shared-encode
peer's sender has it replaced by the track's `ask_keyframe`.

Every way a peer ends closes its RTCPeerConnection and releases its place: DELETE, a negotiation that does
not reach `connected` within `negotiation_timeout_s` (a player that never completes ICE), a failed or closed
connection, its token revoked or run out, its session closing, the server stopping.

Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.rtcrtpparameters import RTCRtpCodecCapability
from aiortc.sdp import SessionDescription

from worldcast.sessions.access import Access, count_spectators
from worldcast.sessions.errors import SessionClosedError
from worldcast.sessions.frames import FrameSink
from worldcast.sessions.session import Session, SessionState
from worldcast.sessions.viewers import Spectator, ViewerConfig, own_encode_weight
from worldcast.transport.connection import retrieve
from worldcast.transport.webrtc.encoded_track import EncodedVideoTrack
from worldcast.transport.webrtc.ice import close_peer_connection
from worldcast.transport.webrtc.sdp import validate_offer
from worldcast.transport.webrtc.video_track import SessionVideoTrack

logger = logging.getLogger(__name__)

#: The codec whose video WHEP peers of a session share (the session's one encode, `SessionEncode`).
SHARED_CODEC = "video/H264"
#: Of H.264's profiles, the one the shared encode's bitstream is (x264 `ultrafast`: Constrained Baseline,
#: profile-level-id 42e0xx, RFC 6184 8.1), preferred over Baseline (42001f) when an offer has both.
SHARED_PROFILE_LEVEL_ID = "42e01f"


def shared_codec_first() -> list[RTCRtpCodecCapability]:
    """aiortc's video codecs in the order a WHEP answer prefers them: H.264 (Constrained Baseline first), then
    the rest (VP8), RTX kept (`RTCRtpTransceiver.setCodecPreferences`; an answer lists the codecs the offer and
    these have in common in this order, and the sender sends the first: aiortc 1.16 `rtcpeerconnection.py`)."""
    codecs = RTCRtpSender.getCapabilities("video").codecs
    return sorted(codecs, key=lambda c: (c.mimeType.lower() != SHARED_CODEC.lower(),
                                         c.parameters.get("profile-level-id") != SHARED_PROFILE_LEVEL_ID))


def answer_video_codec(sdp: str) -> str | None:
    """The codec an SDP answer sends video with: the first of its first video m-line (RFC 3264 6.1: the answerer
    sends with the first it lists), as a MIME type ("video/H264"); None without a video m-line or codec."""
    for media in SessionDescription.parse(sdp).media:
        if media.kind == "video" and media.rtp.codecs:
            return media.rtp.codecs[0].mimeType
    return None


class WhepPeer:
    """One WHEP player's peer connection to a session: the session's video track, nothing in.

    Args:
        session: the session it shows.
        resource_id: its WHEP resource id (the last segment of its `Location`).
        spectator: its place among the session's spectators (released when it closes).
        video_scale: integer upscale of the video.
        negotiation_timeout_s: time from the answer to `connected` before the peer is closed, s.
        on_closed: called once with the peer when it has closed.
    """

    def __init__(self, session: Session, *, resource_id: str, spectator: Spectator, video_scale: int = 1,
                 negotiation_timeout_s: float = 15.0, on_closed: Callable[[WhepPeer], None] | None = None) -> None:
        self.session, self.resource_id, self.spectator = session, resource_id, spectator
        self.negotiation_timeout_s = negotiation_timeout_s
        self.video_scale = video_scale
        #: its video: the shared encode's (H.264) or its own (VP8), chosen by the answer's codec (`answer`)
        self.track: EncodedVideoTrack | SessionVideoTrack | None = None
        self.connected = asyncio.Event()
        self.closed = asyncio.Event()  #: set once the peer is closed
        self.close_reason: str | None = None
        self._closing = False
        self._on_closed = on_closed
        self._tasks: set[asyncio.Task[Any]] = set()
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # from here on, every path ends in aclose()
        self.transceiver = self.pc.addTransceiver("video", direction="sendonly")
        self.transceiver.setCodecPreferences(shared_codec_first())

        @self.pc.on("datachannel")
        def _on_datachannel(channel: Any) -> None:  # a view-only peer takes nothing in
            logger.info("%r: ignoring data channel %r (WHEP is view only)", self, str(channel.label)[:64])

        @self.pc.on("connectionstatechange")
        def _on_state() -> None:
            state = self.pc.connectionState
            logger.info("%r: peer connection %s", self, state)
            if state == "connected":
                self.connected.set()
            elif state in ("failed", "closed"):
                self.spawn(self.aclose(state))

    def __repr__(self) -> str:
        return f"WhepPeer({self.session.id}, {self.resource_id})"

    def spawn(self, coro: Any) -> None:
        """Run `coro` as a task of this peer (a closing peer's own `aclose` is awaited by whoever closes it)."""
        t = asyncio.get_running_loop().create_task(coro, name=f"whep-{self.resource_id}")
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        t.add_done_callback(retrieve)

    async def answer(self, offer_sdp: str) -> RTCSessionDescription:
        """Apply the player's offer (already checked by `validate_offer`), attach the track to the session as a
        spectator, start the negotiation timer, and return the answer (ICE gathering complete).

        Raises:
            ValueError: aiortc cannot negotiate the offer (the peer is closed).
            SessionClosedError: the session closed meanwhile (the peer is closed).
        """
        before = asyncio.all_tasks()
        try:
            try:
                await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
                codec = answer_video_codec((await self.pc.createAnswer()).sdp)  # createAnswer changes nothing
                self.track = self._make_track(codec)
                if not self.shares_encode:  # an encode of its own counts for what it costs (sessions/viewers.py)
                    self.spectator.weight = own_encode_weight()
                self.transceiver.sender.replaceTrack(self.track)
                await self.pc.setLocalDescription(await self.pc.createAnswer())  # the answer names the track
            except Exception as e:
                raise ValueError(f"invalid SDP offer: {e}") from e
            finally:
                for t in asyncio.all_tasks() - before:  # aiortc's connect task, and the like
                    t.add_done_callback(retrieve)
            if self._closing:  # revoked, expired or the session closed while the answer was made
                raise SessionClosedError(f"the viewer's access to session {self.session.id} ended: {self.close_reason}")
            sink = self.sink
            assert sink is not None, "the answer made the track"
            self.session.attach_spectator(sink)  # SessionClosedError if the session closed meanwhile
            if isinstance(self.track, EncodedVideoTrack):
                self.track.start()
            self.spawn(self._negotiation_timer())
        except BaseException:
            await self.aclose("answer_failed")
            raise
        return self.pc.localDescription

    def _make_track(self, codec: str | None) -> EncodedVideoTrack | SessionVideoTrack:
        """The track for the answer's `codec`: the session's shared encode for H.264, else one of its own."""
        s = self.session
        if codec is not None and codec.lower() == SHARED_CODEC.lower():
            spec = s.model.spec
            track = EncodedVideoTrack(s.frames, fps=spec.fps, scale=self.video_scale, stamp=s.stamp_frames,
                                      depth=max(2, spec.frames_per_chunk), name=f"{s.id}-whep-{self.resource_id}")
            # a receiver's PLI/FIR asks the shared encode, within its rate limit (module docstring)
            setattr(self.transceiver.sender, "_send_keyframe", track.ask_keyframe)  # noqa: B010
            return track
        return SessionVideoTrack(s.frames.is_current, scale=self.video_scale, stamp=s.stamp_frames)

    @property
    def sink(self) -> FrameSink | None:
        """What the session delivers this peer's frames to (None before the answer)."""
        return self.track.sink if isinstance(self.track, EncodedVideoTrack) else self.track

    @property
    def shares_encode(self) -> bool:
        """Whether the peer's video is the session's shared encode (H.264 negotiated)."""
        return isinstance(self.track, EncodedVideoTrack)

    async def _negotiation_timer(self) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), self.negotiation_timeout_s)
        except TimeoutError:
            logger.info("%r: not connected %.1f s after the answer: closing", self, self.negotiation_timeout_s)
            await self.aclose("negotiation_timeout")

    async def aclose(self, reason: str = "closed") -> None:
        """Close the peer connection, detach the track and release the spectator's place (idempotent; a second
        caller waits for the first). `closed` is set when done."""
        if self._closing:
            await self.closed.wait()
            return
        self._closing, self.close_reason = True, reason
        try:
            self.spectator.leave()
            if self.sink is not None:
                self.session.detach_sink(self.sink)
            current = asyncio.current_task()
            live = [t for t in self._tasks if t is not current]
            for t in live:
                t.cancel()
            await asyncio.gather(*live, return_exceptions=True)
            if isinstance(self.track, EncodedVideoTrack):
                await self.track.aclose()  # leaves the shared encode (the last to leave stops it)
            elif self.track is not None:
                self.track.stop()
            await close_peer_connection(self.pc)
            logger.info("%r: closed (%s, %s, %d frames out)", self, reason,
                        "shared encode" if self.shares_encode else "own encode",
                        0 if self.track is None else self.track.frames_out)
        finally:
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self)


class WhepResources:
    """Every WHEP resource of the server, by resource id.

    Args:
        sessions: the server's open sessions by id (`SessionManager.sessions`), for the server-wide cap.
        config: the spectator caps (`ViewerConfig`).
        video_scale: integer upscale of the video.
        negotiation_timeout_s: a peer not `connected` this long after its answer is closed, s.
    """

    def __init__(self, sessions: Mapping[str, Session], *, config: ViewerConfig, video_scale: int = 1,
                 negotiation_timeout_s: float = 15.0) -> None:
        self.sessions, self.config = sessions, config
        self.video_scale, self.negotiation_timeout_s = video_scale, negotiation_timeout_s
        self.peers: dict[str, WhepPeer] = {}
        self._closing: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self.peers)

    async def offer(self, access: Access, sdp: str) -> tuple[WhepPeer, RTCSessionDescription]:
        """Answer a WHEP offer: check it, admit a spectator, make its peer, answer.

        Raises:
            InvalidOffer: the offer breaks `validate_offer`'s rules, e.g. it has no video m-line the server can
                send on (nothing was made).
            SpectatorRefused: a spectator cap is reached (nothing was made).
            ValueError: aiortc could not negotiate it (the peer is closed, its place released).
            SessionClosedError: the session closed meanwhile (likewise).
        """
        validate_offer(sdp)
        session = access.session
        resource_id = secrets.token_hex(12)
        holder: list[WhepPeer] = []
        spectator = session.viewers.admit(self.config, kind="whep", viewer=access.viewer,
                                          close=lambda reason: self._close_soon(holder, reason),
                                          server_spectators=count_spectators(list(self.sessions.values())))
        peer = WhepPeer(session, resource_id=resource_id, spectator=spectator, video_scale=self.video_scale,
                        negotiation_timeout_s=self.negotiation_timeout_s, on_closed=self._closed)
        holder.append(peer)
        self.peers[resource_id] = peer
        answer = await peer.answer(sdp)  # closes the peer (and forgets it) on any failure
        if session.state == SessionState.CLOSED or peer.closed.is_set():
            await peer.aclose("session_closed")
            raise SessionClosedError(f"session {session.id} is closed")
        return peer, answer

    def _close_soon(self, holder: list[WhepPeer], reason: str) -> None:
        """`Spectator.close`: the viewer's token was revoked or ran out, or the session closed."""
        if not holder:
            return
        t = asyncio.get_running_loop().create_task(holder[0].aclose(reason), name=f"whep-close-{reason}")
        self._closing.add(t)
        t.add_done_callback(self._closing.discard)
        t.add_done_callback(retrieve)

    def _closed(self, peer: WhepPeer) -> None:
        if self.peers.get(peer.resource_id) is peer:
            del self.peers[peer.resource_id]

    def find(self, access: Access, resource_id: str) -> WhepPeer | None:
        """The resource `resource_id` if `access` may end it: a resource of the same session, opened by the same
        viewer token, or any of the session's when `access` is its controller's (None otherwise)."""
        peer = self.peers.get(resource_id)
        if peer is None or peer.session is not access.session:
            return None
        if access.viewer is not None and peer.spectator.viewer_id != access.viewer.viewer_id:
            return None
        return peer

    async def aclose(self) -> None:
        """Close every peer (server shutdown)."""
        for p in list(self.peers.values()):
            await p.aclose("shutdown")
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
