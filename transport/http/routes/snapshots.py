"""Snapshots over HTTP: POST /v1/sessions/{id}/snapshots (take one), DELETE /v1/snapshots/{id} (remove one); a
session starts from one with `"snapshot": "<id>"` in POST /v1/sessions (`sessions.create_session`).

A snapshot belongs to the token of the session that took it: that token (and no other, not a viewer's) may start
sessions from it or delete it, also after that session closed and after a server restart (`sessions/snapshots.py`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request, Response

from worldcast.sessions.errors import SnapshotNotFound, SnapshotRefused
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import Session
from worldcast.sessions.snapshots import Snapshot
from worldcast.transport.http.routes.deps import bearer_token, manager_dep, session_dep

router = APIRouter()


async def load_snapshot(manager: SessionManager, snapshot_id: str, token: str | None) -> Snapshot:
    """The snapshot `snapshot_id` for the bearer `token`, checked whole (format, model, weights, its bytes).

    Raises:
        HTTPException: 401 without a token.
        SnapshotNotFound: none for this token (404).
        SnapshotRefused: no snapshots here, or one that cannot be used (409, with the reason).
    """
    if token is None:
        raise HTTPException(401, "a session from a snapshot needs 'Authorization: Bearer <token of the session "
                                 "that took it>'", {"WWW-Authenticate": "Bearer"})
    if manager.snapshots is None:
        raise SnapshotNotFound(f"no snapshot {snapshot_id!r} for this token")
    return manager.snapshots.load(snapshot_id, token, weights_sha256=await manager.weights_sha256())


@router.post("/v1/sessions/{session_id}/snapshots", status_code=201)
async def take_snapshot(session: Annotated[Session, Depends(session_dep)],
                        manager: Annotated[SessionManager, Depends(manager_dep)]) -> dict[str, Any]:
    """Keep the session's world, captured at its next chunk boundary (it generates on): 201 with
    `{"snapshot_id", "state_bytes", "next_frame", "created_at"}` (`next_frame`: the index of the frame a session
    started from it makes first); 409 with the reason when it cannot be kept (the store is
    full, a directing session, no snapshots on this server)."""
    meta = await manager.snapshot(session.id)
    return {"snapshot_id": meta["snapshot_id"], "state_bytes": meta["state_bytes"], "next_frame": meta["next_frame"],
            "created_at": meta["created_at"]}


@router.delete("/v1/snapshots/{snapshot_id}", status_code=204)
async def delete_snapshot(snapshot_id: str, request: Request,
                          authorization: Annotated[str | None, Header()] = None) -> Response:
    """Remove a snapshot (the token of the session that took it): 204; 404 for none for this token."""
    token = bearer_token(authorization)
    if token is None:
        raise HTTPException(401, "missing 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"})
    store = request.app.state.manager.snapshots
    if store is None:
        raise SnapshotNotFound(f"no snapshot {snapshot_id[:64]!r} for this token")
    store.delete(snapshot_id, token)
    return Response(status_code=204)


__all__ = ["SnapshotRefused", "load_snapshot", "router"]
