"""WHEP over HTTP (draft-ietf-wish-whep, "WebRTC-HTTP Egress Protocol"): a session's video to a standard player.

    POST    /v1/sessions/{id}/whep         SDP offer (application/sdp) -> 201, SDP answer, Location: the resource
    OPTIONS /v1/sessions/{id}/whep         204, Allow: OPTIONS, POST
    DELETE  /v1/sessions/{id}/whep/{rid}   leave: 200, the peer connection closes
    OPTIONS /v1/sessions/{id}/whep/{rid}   204, Allow: DELETE, OPTIONS
    PATCH   /v1/sessions/{id}/whep/{rid}   405 (no trickle ICE: offer after gathering completes)

Following the draft's playback session setup and teardown (4.2), ICE support (4.3: a server may refuse trickle
ICE and ICE restarts with 405) and bearer-token authentication (4.7). Every request but OPTIONS carries
`Authorization: Bearer <token>`: a viewer token (`POST /v1/sessions/{id}/viewers`) or the session's own.

Refusals, each with a `{"detail": ...}` body saying why:
- 401: no token, or one that opens no session (wrong, expired, revoked);
- 404: a token that opens another session, not this id (as the other routes answer a wrong token), or a
  resource that is not this token's (unknown, ended, another session's or another viewer's);
- 415: a POST whose Content-Type is not application/sdp;
- 400: a malformed offer, or one without a video m-line the server can send on (a data-channel-only offer
  too), with the first rule it breaks (`transport/webrtc/sdp.py`);
- 429: the session has as many spectators as it takes; 503 (with Retry-After): the server has.

Cross-origin players (a web page on another origin, Fetch's CORS): `WhepCors` answers every WHEP request,
refusals included, with `Access-Control-Allow-Origin: *` and exposes `Location`; a preflight (OPTIONS with
`Access-Control-Request-Method`) is allowed `Authorization` and `Content-Type`. `*` is safe here: the
credential is a bearer token the page sends explicitly (never a cookie), so another origin gets nothing
without it.

The peers are `transport/webrtc/whep.py`'s; the token check is `sessions/access.authorize`.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request, Response

from worldcast.sessions.access import Access, authorize, token_opens_any
from worldcast.transport.errors import InvalidOffer
from worldcast.transport.http.body import media_type
from worldcast.transport.http.routes.deps import NOT_FOUND_DETAIL, bearer_token, printable
from worldcast.transport.schemas import MAX_SDP_CHARS
from worldcast.transport.webrtc.whep import WhepResources

logger = logging.getLogger(__name__)

router = APIRouter()

#: The media type of an SDP offer and answer (RFC 4566 8.2.2, RFC 3264).
SDP_TYPE = "application/sdp"
#: The trickle-ICE fragment type a PATCH would carry (RFC 8840 9.1); refused with 405 here.
TRICKLE_TYPE = "application/trickle-ice-sdpfrag"
#: Largest SDP offer, bytes (the JSON signaling route's own limit).
MAX_OFFER_BYTES = MAX_SDP_CHARS
ENDPOINT_METHODS = "OPTIONS, POST"
RESOURCE_METHODS = "DELETE, OPTIONS"


#: The CORS headers of every WHEP response (Fetch standard, "CORS protocol"): any origin, `Location` (and the
#: refusals' `WWW-Authenticate`, `Retry-After`, `Allow`) readable by the page.
CORS_HEADERS = [(b"access-control-allow-origin", b"*"),
                (b"access-control-expose-headers", b"Location, WWW-Authenticate, Retry-After, Allow, Accept-Post")]
#: What a preflight is also told: the request headers a player sends, for how long to cache the answer (s).
PREFLIGHT_HEADERS = [(b"access-control-allow-methods", b"POST, DELETE, OPTIONS, PATCH"),
                     (b"access-control-allow-headers", b"Authorization, Content-Type, If-Match"),
                     (b"access-control-max-age", b"600")]


class WhepCors:
    """ASGI middleware: CORS headers on every WHEP response (see the module docstring); other paths untouched.
    Added outside `BodyPolicy`, so its 413 and 415 carry them too."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not is_whep_path(scope.get("path", "")):
            return await self.app(scope, receive, send)
        preflight = scope["method"] == "OPTIONS" and any(
            k == b"access-control-request-method" for k, _ in scope["headers"])
        extra = CORS_HEADERS + (PREFLIGHT_HEADERS if preflight else [])

        async def send_with_cors(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def is_whep_path(path: str) -> bool:
    """Whether `path` is a WHEP endpoint or resource (`/v1/sessions/{id}/whep[/{rid}]`): its body rule differs."""
    parts = path.split("/")
    return len(parts) in (5, 6) and parts[1:3] == ["v1", "sessions"] and parts[4] == "whep"


def whep_access(request: Request, session_id: str, authorization: str | None) -> Access:
    """What the bearer token opens on session `session_id` (a viewer's or the controller's access).

    Raises:
        HTTPException: 401 (with `WWW-Authenticate: Bearer`) without a token or with one that opens no session
            at all; 404 for a token that opens sessions, but not this id.
    """
    token = bearer_token(authorization)
    challenge = {"WWW-Authenticate": "Bearer"}
    if token is None:
        raise HTTPException(401, "missing 'Authorization: Bearer <token>' (a viewer token or the session's)",
                            challenge)
    sessions = request.app.state.manager.sessions
    access = authorize(sessions, session_id, token)
    if access is not None:
        return access
    if token_opens_any(sessions, token):
        raise HTTPException(404, NOT_FOUND_DETAIL)
    raise HTTPException(401, "the token opens no session (wrong, expired or revoked)", challenge)


@router.options("/v1/sessions/{session_id}/whep", status_code=204)
async def whep_endpoint_options(session_id: str) -> Response:
    """The endpoint's methods (no body; no token needed: it says nothing about the session)."""
    return Response(status_code=204, headers={"Allow": ENDPOINT_METHODS, "Accept-Post": SDP_TYPE})


@router.post("/v1/sessions/{session_id}/whep", status_code=201,
             responses={201: {"content": {SDP_TYPE: {}}, "description": "the SDP answer; Location: the resource"}},
             openapi_extra={"requestBody": {"required": True, "content": {SDP_TYPE: {"schema": {"type": "string"}}}}})
async def whep_offer(
    session_id: str,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    content_type: Annotated[str | None, Header()] = None,
) -> Response:
    """Answer a WHEP player's SDP offer (draft-ietf-wish-whep 4.2): 201 with the SDP answer and `Location`, the
    resource to DELETE to leave. See the module docstring for every refusal."""
    if bearer_token(authorization) is None:
        whep_access(request, session_id, authorization)  # 401 before the route looks at anything else
        # (a body that is not SDP was already refused 415 by the body rule, `BodyPolicy`)
    mtype = media_type(content_type.encode("latin-1") if content_type is not None else None)
    if mtype != SDP_TYPE:
        what = "no Content-Type" if mtype is None else f"content type {mtype!r}"
        raise HTTPException(415, f"{what}: a WHEP offer is {SDP_TYPE}")
    access = whep_access(request, session_id, authorization)
    raw = await request.body()
    try:
        sdp = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "invalid SDP offer: not UTF-8 (RFC 8866 5)") from None
    resources: WhepResources = request.app.state.whep
    try:
        peer, answer = await resources.offer(access, sdp)
    except InvalidOffer as e:
        raise HTTPException(400, str(e)) from None
    except ValueError as e:
        raise HTTPException(400, printable(e, 300)) from None
    location = f"/v1/sessions/{session_id}/whep/{peer.resource_id}"
    return Response(answer.sdp, status_code=201, media_type=SDP_TYPE, headers={"Location": location})


@router.delete("/v1/sessions/{session_id}/whep/{resource_id}")
async def whep_delete(
    session_id: str,
    resource_id: str,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    """End a WHEP resource (draft-ietf-wish-whep 4.2): 200 once its peer connection is closed; 404 for a
    resource that is not this token's."""
    access = whep_access(request, session_id, authorization)
    resources: WhepResources = request.app.state.whep
    peer = resources.find(access, resource_id)
    if peer is None:
        raise HTTPException(404, "no such WHEP resource for this token")
    await peer.aclose("deleted")
    return Response(status_code=200)


@router.options("/v1/sessions/{session_id}/whep/{resource_id}", status_code=204)
async def whep_resource_options(session_id: str, resource_id: str) -> Response:
    """The resource's methods (no trickle ICE, so no PATCH)."""
    return Response(status_code=204, headers={"Allow": RESOURCE_METHODS})


@router.patch("/v1/sessions/{session_id}/whep/{resource_id}", status_code=405)
async def whep_patch(session_id: str, resource_id: str) -> Response:
    """Trickle ICE and ICE restarts are not supported (draft-ietf-wish-whep 4.3 lets a server answer 405): the
    offer must carry its candidates (gathering complete)."""
    return Response('{"detail":"trickle ICE and ICE restarts are not supported: offer after ICE gathering '
                    'completes"}', status_code=405, media_type="application/json", headers={"Allow": RESOURCE_METHODS})
