"""Dependencies the routers share: the session manager, and a session opened by its Bearer token."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Header, HTTPException, Request

from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import Session, SessionState

#: What an unknown id and a token that does not open the session both answer (the same for both).
NOT_FOUND_DETAIL = "no such session for this token"
#: Compared against when the id is unknown, so that both cases take the same time.
_NO_TOKEN = secrets.token_urlsafe(24)


def printable(x: object, limit: int = 200) -> str:
    """A short, always-encodable rendering of an error fragment (at most `limit` characters)."""
    return str(x)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def manager_dep(request: Request) -> SessionManager:
    """The server's `SessionManager`."""
    return request.app.state.manager


def session_dep(
    session_id: str,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Session:
    """The open session `session_id` if `Authorization: Bearer <its token>` opens it.

    An unauthenticated caller learns nothing about which ids exist: no token is 401 whatever the id,
    and an unknown id or a token of another session are the same 404, after the same comparison.

    Raises:
        HTTPException: 401 without a Bearer token (auth schemes are case-insensitive, RFC 7235 2.1);
            404 (`NOT_FOUND_DETAIL`) for an unknown or closed id or a token that does not open it.
    """
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "missing 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"})
    session = request.app.state.manager.sessions.get(session_id)
    open_ = session is not None and session.state != SessionState.CLOSED
    expected = session.token if open_ else _NO_TOKEN  # type: ignore[union-attr]
    if not secrets.compare_digest(token.encode(), expected.encode()) or not open_:
        raise HTTPException(404, NOT_FOUND_DETAIL)
    return session  # type: ignore[return-value]


def is_operator(request: Request) -> bool:
    """Whether the request carries `Authorization: Bearer <admin token>` (compared in constant time); False
    when the server has no admin token. Any other header is simply not the operator's."""
    expected: str | None = request.app.state.admin_token
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if expected is None or scheme.lower() != "bearer" or not token.strip():
        return False
    return secrets.compare_digest(token.strip().encode(), expected.encode())
