"""Dependencies the routers share: the session manager, and a session opened by its Bearer token (the check
itself is `sessions/access.authorize`, the one owner of it)."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Header, HTTPException, Request

from worldcast.sessions.access import Access, authorize
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import Session

#: What an unknown id and a token that does not open the session both answer (the same for both).
NOT_FOUND_DETAIL = "no such session for this token"


def printable(x: object, limit: int = 200) -> str:
    """A short, always-encodable rendering of an error fragment (at most `limit` characters)."""
    return str(x)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def manager_dep(request: Request) -> SessionManager:
    """The server's `SessionManager`."""
    return request.app.state.manager


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value (None: no header, another scheme, or empty;
    auth schemes are case-insensitive, RFC 7235 2.1)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def session_dep(
    session_id: str,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Session:
    """The open session `session_id` if `Authorization: Bearer <its token>` opens it as its controller.

    An unauthenticated caller learns nothing about which ids exist: no token is 401 whatever the id,
    and an unknown id, a token of another session and a viewer token of this one are the same 404 (a viewer
    token can never act, direct, control, read the session or create viewers: `sessions/viewers.py`).

    Raises:
        HTTPException: 401 without a Bearer token; 404 (`NOT_FOUND_DETAIL`) for an unknown or closed id or a
            token that does not open it as its controller.
    """
    access = access_dep(session_id, request, authorization)
    if not access.controller:
        raise HTTPException(404, NOT_FOUND_DETAIL)
    return access.session


def steward_dep(
    session_id: str,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Session:
    """The open session `session_id` if the bearer token is its own (its owner's, who keeps managing its viewers
    and control while a viewer holds control) or the one holding control now.

    Raises:
        HTTPException: as `session_dep`.
    """
    access = access_dep(session_id, request, authorization)
    if not (access.owner or access.controller):
        raise HTTPException(404, NOT_FOUND_DETAIL)
    return access.session


def access_dep(
    session_id: str,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Access:
    """What `Authorization: Bearer <token>` opens on session `session_id`: its controller's or a viewer's access
    (`sessions/access.authorize`).

    Raises:
        HTTPException: 401 without a Bearer token; 404 (`NOT_FOUND_DETAIL`) for an unknown or closed id or a
            token that opens nothing there.
    """
    token = bearer_token(authorization)
    if token is None:
        raise HTTPException(401, "missing 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"})
    access = authorize(request.app.state.manager.sessions, session_id, token)
    if access is None:
        raise HTTPException(404, NOT_FOUND_DETAIL)
    return access


def is_operator(request: Request) -> bool:
    """Whether the request carries `Authorization: Bearer <admin token>` (compared in constant time); False
    when the server has no admin token. Any other header is simply not the operator's."""
    expected: str | None = request.app.state.admin_token
    token = bearer_token(request.headers.get("authorization"))
    if expected is None or token is None:
        return False
    return secrets.compare_digest(token.encode(), expected.encode())
