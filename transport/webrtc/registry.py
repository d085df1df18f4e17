"""PeerRegistry: every WebRTC peer connection of one server, by session.

A session has at most one *live* peer (the one a client is watching) and at
most one *pending* peer (a re-offer still negotiating). Renegotiation is
make-before-break: each offer gets a new RTCPeerConnection; a re-offer's
peer receives the session's frames at once but replaces the live one only
when it reaches `connected`; if it never does (bad network, a client that
never applies the answer) it is closed by its negotiation timeout and the
live peer keeps streaming. A bad offer is refused (`transport/webrtc/sdp.py`)
before any peer connection is made, so it never touches the live one.

Every peer is known here from the moment its RTCPeerConnection exists until
it is closed; every error path closes it (`WebRTCPeer.answer`), and a peer
removes itself when it closes, whatever closed it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

from aiortc import RTCSessionDescription

from worldcast.sessions.errors import SessionClosedError
from worldcast.sessions.session import Session, SessionState
from worldcast.transport.connection import retrieve as _retrieve
from worldcast.transport.webrtc.peer import WebRTCPeer
from worldcast.transport.webrtc.sdp import validate_offer

logger = logging.getLogger(__name__)

#: Builds a peer for a session: (session, on_connected, on_closed, settle) -> WebRTCPeer.
PeerFactory = Callable[..., WebRTCPeer]


class PeerRegistry:
    """Live and pending peers per session id.

    Args:
        make_peer: builds a `WebRTCPeer` for a session; called with keyword arguments
            on_connected, on_closed and settle, which it must pass on.
        on_close: metrics hook, called with each closed peer's `close_reason`.
    """

    def __init__(self, make_peer: PeerFactory, *, on_close: Callable[[str], None] | None = None) -> None:
        self._make = make_peer
        self._on_close = on_close
        self.live: dict[str, WebRTCPeer] = {}
        self.pending: dict[str, WebRTCPeer] = {}
        self._all: set[WebRTCPeer] = set()  #: every peer not yet closed, registered or not
        self._locks: weakref.WeakKeyDictionary[Session, asyncio.Lock] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        """Peers whose connection is not closed yet."""
        return len(self._all)

    def peers_of(self, session_id: str) -> list[WebRTCPeer]:
        return [p for p in (self.live.get(session_id), self.pending.get(session_id)) if p is not None]

    async def settle(self, session: Session, epoch: int) -> None:
        """Wait until no peer of `session` is sending a frame older than `epoch` (flush/cancel replies)."""
        peers = self.peers_of(session.id)
        if peers:
            await asyncio.gather(*(p.track.settle(epoch) for p in peers))

    async def offer(self, session: Session, sdp: str) -> RTCSessionDescription:
        """Answer an offer for `session`: validate, make a peer, answer, register it.

        Raises:
            InvalidOffer: the offer breaks `validate_offer`'s rules (nothing was made).
            ValueError: aiortc could not negotiate it (the new peer is closed; the live one is kept).
            SessionClosedError: the session closed before the answer was ready (the new peer is closed).
        """
        validate_offer(sdp)
        lock = self._locks.setdefault(session, asyncio.Lock())
        async with lock:  # one negotiation per session at a time
            if session.state == SessionState.CLOSED:
                raise SessionClosedError(f"session {session.id} is closed")
            peer = self._make(session, on_connected=self._connected, on_closed=self._closed,
                              settle=lambda epoch: self.settle(session, epoch))
            self._all.add(peer)
            answer = await peer.answer(sdp)  # closes the peer on any failure
            if session.state == SessionState.CLOSED:  # closed while answering, after attaching
                await peer.aclose("session_closed")
                raise SessionClosedError(f"session {session.id} is closed")
            old_pending = self.pending.pop(session.id, None)
            if session.id in self.live:
                self.pending[session.id] = peer
            else:
                self.live[session.id] = peer
                session.inputs.new_client()
        if old_pending is not None:
            await old_pending.aclose("superseded")
        return answer

    def _connected(self, peer: WebRTCPeer) -> None:
        sid = peer.session.id
        if sid not in self.pending or self.pending[sid] is not peer:
            return
        del self.pending[sid]
        old = self.live.get(sid)
        self.live[sid] = peer
        peer.session.inputs.new_client()  # the new client's seq numbering starts afresh
        if old is not None:
            logger.info("%r: replaced by a renegotiated peer", old.session)
            t = asyncio.get_running_loop().create_task(old.aclose("replaced"), name=f"replace-{sid}")
            t.add_done_callback(_retrieve)

    def _closed(self, peer: WebRTCPeer) -> None:
        self._all.discard(peer)
        sid = peer.session.id
        for d in (self.live, self.pending):
            if d.get(sid) is peer:
                del d[sid]
        if self._on_close is not None:
            self._on_close(peer.close_reason or "closed")

    async def close_session(self, session_id: str, reason: str = "client") -> None:
        """Close every peer of a session (before the session itself is closed)."""
        for p in self.peers_of(session_id):
            await p.aclose(reason)

    async def aclose(self) -> None:
        """Close every peer (server shutdown)."""
        for p in list(self._all):
            await p.aclose("shutdown")

    def stats(self) -> dict[str, Any]:
        return {"peers": len(self._all), "live": len(self.live), "pending": len(self.pending)}
