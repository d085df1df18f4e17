"""WebRTC signaling: POST /v1/sessions/{id}/webrtc, an SDP offer -> our answer (`webrtc/registry.PeerRegistry`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request

from worldcast.sessions.session import Session
from worldcast.transport.errors import InvalidOffer
from worldcast.transport.http.routes.deps import printable, session_dep
from worldcast.transport.schemas import SdpAnswer, SdpOffer
from worldcast.transport.webrtc.registry import PeerRegistry

router = APIRouter()


@router.post("/v1/sessions/{session_id}/webrtc", response_model=SdpAnswer)
async def webrtc_offer(
    offer: SdpOffer,
    session: Annotated[Session, Depends(session_dep)],
    request: Request,
) -> SdpAnswer:
    """400 with the reason for an offer refused (`transport/webrtc/sdp.py`) or that aiortc cannot negotiate."""
    peers: PeerRegistry = request.app.state.peers
    try:
        answer = await peers.offer(session, offer.sdp)  # a bad offer leaves the current peer untouched
    except InvalidOffer as e:
        raise HTTPException(400, str(e)) from None
    except ValueError as e:
        raise HTTPException(400, printable(e, 300)) from None
    return SdpAnswer(sdp=answer.sdp, type="answer")
