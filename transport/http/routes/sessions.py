"""Sessions over HTTP: POST /v1/sessions (create), GET and DELETE /v1/sessions/{id}, and one control RPC
at POST /v1/sessions/{id}/rpc (the control data channel's RPCs and rate, `rpc.RpcHandler`)."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from worldcast.sessions.errors import CapacityExhausted
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import CloseReason, Session
from worldcast.transport import errors
from worldcast.transport.http.model_api import model_info, read_create_body
from worldcast.transport.http.routes.deps import bearer_token, is_operator, manager_dep, session_dep
from worldcast.transport.http.routes.snapshots import load_snapshot
from worldcast.transport.rpc import RpcHandler, TokenBucket, error_reply
from worldcast.transport.schemas import CreateSessionRequest, CreateSessionResponse
from worldcast.transport.webrtc.peer import CONTROL_BURST, CONTROL_RATE_HZ
from worldcast.transport.webrtc.registry import PeerRegistry

logger = logging.getLogger(__name__)

router = APIRouter()

#: The OpenAPI request body of POST /v1/sessions (parsed by `model_api.read_create_body`: JSON or multipart).
CREATE_REQUEST_BODY = {"required": False, "content": {
    "application/json": {"schema": CreateSessionRequest.model_json_schema()},
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "image": {"type": "string", "format": "binary"}, "prompt": {"type": "string"},
        "seed": {"type": "integer"}, "stamp_frames": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["interactive", "directing"]},
        "transport": {"type": "string", "enum": ["webrtc", "livekit"]}, "room": {"type": "string"}}}}}}


@router.post("/v1/sessions", status_code=201, response_model=CreateSessionResponse,
             openapi_extra={"requestBody": CREATE_REQUEST_BODY})
async def create_session(
    manager: Annotated[SessionManager, Depends(manager_dep)],
    request: Request,
) -> CreateSessionResponse:
    """Create a session (and, for `transport: livekit`, its world in the room); nothing stays allocated
    when any step fails or the client goes away mid-request."""
    def check_capacity() -> None:
        d = manager.admission_decision()
        if not d.admitted:
            raise CapacityExhausted(f"refused: {d.reason}", retry_after_s=d.retry_after_s)

    body, image = await read_create_body(request, manager.model, check_capacity=check_capacity,
                                         decodes=request.app.state.image_decodes)
    worlds = request.app.state.livekit
    if body.transport == "livekit" and worlds is None:
        raise HTTPException(400, "transport 'livekit' needs a LiveKit server: start with --livekit-url "
                                 "(or LIVEKIT_URL), --livekit-api-key and --livekit-api-secret")
    snapshot = None
    if body.snapshot is not None:
        snapshot = await load_snapshot(manager, body.snapshot, bearer_token(request.headers.get("authorization")))
    s = await manager.create(prompt=body.prompt, image=image, seed=body.seed, stamp_frames=body.stamp_frames,
                             mode=body.mode, record=body.record, snapshot=snapshot)
    livekit = None
    try:  # whatever fails from here on (or a client gone mid-request), nothing stays allocated
        if body.transport == "livekit":
            try:
                livekit = await worlds.serve(s, room=body.room, operator=is_operator(request))
            except errors.LiveKitRoomTaken as e:
                raise HTTPException(409, str(e)) from None
            except errors.LiveKitJoinError as e:
                raise HTTPException(502, str(e)) from None
        return CreateSessionResponse(session_id=s.id, token=s.token, model=model_info(manager.model),
                                     livekit=livekit)
    except HTTPException as e:
        manager.close(s.id, CloseReason.ERROR, detail=f"create refused ({e.status_code}): {e.detail}")
        raise
    except Exception as e:
        manager.close(s.id, CloseReason.ERROR, detail=f"create failed: {type(e).__name__}: {e}")
        logger.exception("Session(%s): create failed", s.id)
        raise HTTPException(500, f"internal error while creating the session ({type(e).__name__}); "
                                 "nothing was kept") from None
    except BaseException:  # cancelled: the client went away mid-request
        manager.close(s.id, CloseReason.ERROR, detail="the client went away during the create")
        raise


@router.get("/v1/sessions/{session_id}")
async def get_session(session: Annotated[Session, Depends(session_dep)]) -> dict[str, Any]:
    return session.info()


@router.delete("/v1/sessions/{session_id}", status_code=204)
async def delete_session(
    session: Annotated[Session, Depends(session_dep)],
    request: Request,
) -> Response:
    await request.app.state.peers.close_session(session.id, "client")
    request.app.state.manager.close(session.id, CloseReason.CLIENT)
    return Response(status_code=204)


@router.post("/v1/sessions/{session_id}/rpc", responses={204: {"description": "a JSON-RPC 2.0 notification"}})
async def rpc(
    body: Annotated[Any, Body()],
    session: Annotated[Session, Depends(session_dep)],
    request: Request,
) -> Response:
    """One RPC, within the control data channel's rate (429 past it); 404 for an unknown method, 409 for a
    closed session, 400 for any other error reply, 204 for a notification."""
    peers: PeerRegistry = request.app.state.peers
    buckets: dict[str, TokenBucket] = request.app.state.rpc_buckets
    if len(buckets) > 2 * len(request.app.state.manager.sessions) + 16:  # forget closed sessions' buckets
        for sid in [sid for sid in buckets if sid not in request.app.state.manager.sessions]:
            del buckets[sid]
    bucket = buckets.setdefault(session.id, TokenBucket(CONTROL_RATE_HZ, CONTROL_BURST))
    if not bucket.take(time.monotonic()):  # the same budget as the control data channel
        return JSONResponse(error_reply(body, errors.RATE_LIMITED, f"more than {CONTROL_RATE_HZ:g} control "
                                        f"requests per second (bursts of {CONTROL_BURST:g})"),
                            status_code=429, headers={"Retry-After": "1"})
    handler = RpcHandler(session, settle=lambda epoch: peers.settle(session, epoch))
    reply = await handler.handle(body)
    if reply is None:
        return Response(status_code=204)
    status = 200
    if "error" in reply:
        status = 404 if reply["error"]["code"] == errors.METHOD_NOT_FOUND else 400
        if reply["error"]["code"] == errors.SESSION_CLOSED:
            status = 409
    return JSONResponse(reply, status_code=status)
