"""Viewer tokens and control over HTTP: POST /v1/sessions/{id}/viewers (mint one; for a session served in a
LiveKit room, with a subscribe-only LiveKit token too), DELETE /v1/sessions/{id}/viewers/{viewer_id} (revoke it
and close its streams) and POST /v1/sessions/{id}/control (hand control to a viewer, or take it back). Each needs
the session's own token or the token holding control (`deps.steward_dep`; any other viewer token is answered 404
as a wrong one). The records and the token check are `sessions/viewers.py`'s and `sessions/access.py`'s."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Body, Depends, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from worldcast.sessions.session import Session
from worldcast.sessions.viewers import ViewerConfig
from worldcast.transport.http.routes.deps import steward_dep
from worldcast.transport.schemas import LiveKitAccess

logger = logging.getLogger(__name__)

router = APIRouter()


class ViewerRequest(BaseModel):
    """Body of POST /v1/sessions/{id}/viewers (optional: an empty body takes every default)."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: float | None = Field(None, description="how long the viewer token lives, s (default and bounds: the "
                                "server's `ViewerConfig`; 3600 by default, 10 to 86400)", allow_inf_nan=False)


class ViewerResponse(BaseModel):
    """A new viewer token and where it plays."""

    viewer_id: str = Field(description="DELETE /v1/sessions/{id}/viewers/{viewer_id} revokes it")
    viewer_token: str = Field(description="send as 'Authorization: Bearer <viewer_token>': watch only")
    whep_url: str = Field(description="the session's WHEP endpoint (POST an SDP offer, application/sdp)")
    stream_url: str = Field(description="the session's worldcast stream (WebSocket, fMP4; read-only for a viewer)")
    expires_in_s: float = Field(description="the token runs out after this, s; its streams are closed then")
    livekit: LiveKitAccess | None = Field(None, description="a session served in a LiveKit room: subscribe-only "
                                          "access to it (join hidden, subscribe; no media, no data); else null")


def viewer_config(request: Request) -> ViewerConfig:
    """The server's `ViewerConfig` (`ServerConfig.viewers`)."""
    return request.app.state.config.viewers  # type: ignore[no-any-return]


@router.post("/v1/sessions/{session_id}/viewers", status_code=201, response_model=ViewerResponse)
async def create_viewer(
    session: Annotated[Session, Depends(steward_dep)],
    request: Request,
    body: Annotated[ViewerRequest | None, Body()] = None,
) -> ViewerResponse:
    """Mint a view-only token for the session: 201; 422 for a `ttl_s` out of bounds; 429 when the session has
    as many live viewer tokens as it may (`ViewerConfig.max_tokens_per_session`)."""
    config = viewer_config(request)
    try:
        v = session.viewers.issue(config, ttl_s=None if body is None else body.ttl_s)
    except ValueError as e:
        raise HTTPException(422, f"ttl_s: {e}") from None
    base = str(request.base_url).rstrip("/")
    worlds = request.app.state.livekit
    livekit = None if worlds is None else worlds.viewer_access(session, v)
    return ViewerResponse(viewer_id=v.viewer_id, viewer_token=v.token,
                          whep_url=f"{base}/v1/sessions/{session.id}/whep",
                          stream_url="ws" + base.removeprefix("http") + f"/v1/sessions/{session.id}/stream",
                          expires_in_s=round(v.expires_at_s - session.clock(), 3), livekit=livekit)


@router.delete("/v1/sessions/{session_id}/viewers/{viewer_id}", status_code=204)
async def delete_viewer(
    viewer_id: str,
    session: Annotated[Session, Depends(steward_dep)],
) -> Response:
    """Revoke a viewer token: 204, and every stream it opened is closed; 404 for an id that is not a live
    viewer of this session."""
    if not session.viewers.revoke(viewer_id):
        raise HTTPException(404, "no such viewer of this session")
    return Response(status_code=204)


class ControlRequest(BaseModel):
    """Body of POST /v1/sessions/{id}/control."""

    model_config = ConfigDict(extra="forbid")

    to: str | None = Field(description="the viewer id to hand control to; null: back to the session's own token")


@router.post("/v1/sessions/{session_id}/control")
async def hand_over_control(
    body: ControlRequest,
    session: Annotated[Session, Depends(steward_dep)],
    request: Request,
) -> dict[str, str | None]:
    """Hand control of the session to one of its live viewers, or back to its own token (`Session.hand_over`):
    one controller at a time; the previous controller's connections close. Asked by the session's own token (it
    may always take control back) or the viewer holding control; another viewer's token gets a wrong token's 404;
    404 for no live viewer of that id; 409 for a session served in a LiveKit room (not supported there yet)."""
    worlds = request.app.state.livekit
    if worlds is not None and session.id in worlds.worlds:
        raise HTTPException(409, "handing over control is not supported for sessions in a LiveKit room yet")
    try:
        session.hand_over(body.to)
    except ValueError as e:
        raise HTTPException(404, str(e)) from None
    return {"controller": body.to}
