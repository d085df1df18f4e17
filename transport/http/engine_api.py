"""The engine cores at the network edge: building them from the server's config, and their routes.

Routes:
    GET  /v1/engines                   every engine: id and state; with the admin token also device, pid,
                                       sessions, load
    GET  /v1/engines/{id}              one engine (the same two views)
    POST /v1/engines/{id}/drain        move every session off it, stop placing on it   (operator)
    POST /v1/engines/{id}/undrain      place sessions on it again                       (operator)
    POST /v1/sessions/{id}/move        move one session: {"engine": id | null, "verify": bool} (operator)

Operator routes need `Authorization: Bearer <admin token>` (`--admin-token`, or the
WORLDCAST_ADMIN_TOKEN environment variable); a server started without one answers
them 403.

The two reads answer a caller without an `Authorization` header what `GET /readyz` says and no more (each
engine's id and state, how many are up): an engine's pid and the ids of the sessions on it are the
operator's, so that the engine routes do not undo the session routes' uniform 401/404 (issue 31, item 3).
A header that is not the admin token is refused (401/403, as on the operator routes), never read as
anonymous.
"""

from __future__ import annotations

import logging
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from worldcast.engine.engine_handle import EngineHandle
from worldcast.engine.local_engine import LocalEngine
from worldcast.engine.process.client import EngineClient, EngineLaunch
from worldcast.engine.tuning.threads import available_cores
from worldcast.models.base import WorldModel
from worldcast.sessions import moves
from worldcast.sessions.manager import SessionManager
from worldcast.transport.config import ServerConfig


def build_engines(config: ServerConfig, model: WorldModel) -> list[EngineHandle]:
    """One engine core per configured device: threads of this process sharing `model`, or processes that
    each build the model through the registry by name (`config.isolated`).

    CPU engine processes each get an equal share of the cores left after `engine.reserved_cores`
    (at least one) for their intra-op threads, measured within that share at warm-up.

    Raises:
        ValueError: in-process engines on devices other than the model's (they share the one model).
    """
    devices = config.engine_devices
    if not config.isolated:
        if any(d != devices[0] for d in devices):
            raise ValueError("engines in this process share one model on one device; run several devices with "
                             "engine processes (--devices starts them)")
        return [LocalEngine(i, model, config.engine) for i in range(len(devices))]
    cpu = sum(1 for d in devices if d == "cpu")
    share = max(1, (available_cores() - config.engine.reserved_cores) // cpu) if cpu else None
    level = logging.getLogger().getEffectiveLevel()
    return [EngineClient(i, EngineLaunch(model=config.model, weights=config.weights, options=dict(config.model_options),
                                         device=d, config=config.engine, thread_share=share if d == "cpu" else None,
                                         log_level=level),
                         spec=model.spec, restart=config.restart)
            for i, d in enumerate(devices)]


class MoveRequest(BaseModel):
    """POST /v1/sessions/{id}/move."""

    model_config = ConfigDict(extra="forbid")
    engine: int | None = Field(default=None, ge=0, description="target engine id (null: where placement puts it)")
    verify: bool = Field(default=False, description="compare the state bytes captured on the target after the "
                         "restore with those that left the source")


def _manager(request: Request) -> SessionManager:
    return request.app.state.manager


def _admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """The operator routes' check: the admin token, compared in constant time.

    Raises:
        HTTPException: 403 when the server has no admin token or the token is another; 401 without a
            Bearer token.
    """
    expected: str | None = request.app.state.admin_token
    if expected is None:
        raise HTTPException(403, "operator routes are off: start the server with --admin-token "
                                 "(or WORLDCAST_ADMIN_TOKEN)")
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "missing 'Authorization: Bearer <admin token>'", {"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(token.strip().encode(), expected.encode()):
        raise HTTPException(403, "not the admin token")


def _operator(request: Request, authorization: Annotated[str | None, Header()] = None) -> bool:
    """The read routes' check: False for a caller without an `Authorization` header (the public view), True
    for the admin token.

    Raises:
        HTTPException: as `_admin` for a header that is not the admin token.
    """
    if authorization is None:
        return False
    _admin(request, authorization)
    return True


def public_engine_info(engine: EngineHandle) -> dict[str, Any]:
    """What anyone may know of one engine: its id and state, as `GET /readyz` lists them (`states`)."""
    return {"id": engine.id, "state": engine.state}


Manager = Annotated[SessionManager, Depends(_manager)]
Operator = Annotated[bool, Depends(_operator)]


#: The engine routes (module docstring); `app.state.manager` is the `SessionManager`, `app.state.admin_token`
#: the operator token (None: operator routes answer 403).
router = APIRouter()


@router.get("/v1/engines")
async def list_engines(manager: Manager, operator: Operator) -> dict[str, Any]:
    """Every engine: the full `EngineHandle.info()` for the operator, else `public_engine_info`."""
    return {"engines": [e.info() if operator else public_engine_info(e) for e in manager.engines], "up": manager.engines_up,
            "total": len(manager.engines)}


@router.get("/v1/engines/{engine_id}")
async def get_engine(engine_id: int, manager: Manager, operator: Operator) -> dict[str, Any]:
    """One engine, in the caller's view (as `list_engines`); an unknown id is 404 (`EngineNotFound`)."""
    e = manager.engine(engine_id)
    return e.info() if operator else public_engine_info(e)


@router.post("/v1/engines/{engine_id}/drain", dependencies=[Depends(_admin)])
async def drain_engine(engine_id: int, manager: Manager) -> dict[str, Any]:
    report = await moves.drain(manager, engine_id)
    return {"engine": manager.engine(engine_id).info(), "moved": [r.info() for r in report.moved],
            "stayed": report.stayed}


@router.post("/v1/engines/{engine_id}/undrain", dependencies=[Depends(_admin)])
async def undrain_engine(engine_id: int, manager: Manager) -> dict[str, Any]:
    moves.undrain(manager, engine_id)
    return manager.engine(engine_id).info()


@router.post("/v1/sessions/{session_id}/move", dependencies=[Depends(_admin)])
async def move_session(session_id: str, manager: Manager, body: MoveRequest | None = None) -> dict[str, Any]:
    body = body or MoveRequest()
    report = await moves.move_session(manager, session_id, to=body.engine, verify=body.verify)
    return report.info()
