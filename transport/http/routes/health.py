"""Health routes: GET /healthz (liveness, with `service`), GET /readyz (readiness), GET /metrics (Prometheus)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worldcast.sessions.manager import SessionManager
from worldcast.transport.dreamverse.http import SERVICE

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok", "service": SERVICE}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 when at least one engine is alive and not stalled (with `degraded` when even one session runs
    below real time), else 503 with each engine's reason."""
    manager: SessionManager = request.app.state.manager
    engines = {"up": manager.engines_up, "total": len(manager.engines),
               "states": {str(e.id): e.state for e in manager.engines}}
    if manager.ready:
        body: dict[str, Any] = {"status": "ready", "model": manager.model.spec.name, "engines": engines}
        if all(e.degraded for e in manager.engines if e.ready):  # still serves, one session at a time: say so
            body |= {"degraded": True, "reason": "the measured chunk time exceeds the chunk budget even for "
                     "one session: one session at a time, below real time"}
        return JSONResponse(body)
    reasons = []
    for e in manager.engines:
        if e.state == "stalled":
            reasons.append(f"engine {e.id}: stalled, its device loop made no progress for {e.no_progress_s():.1f} s")
        elif e.state == "ready" and e.stalled_s > 0:
            c = e.config
            reasons.append(f"engine {e.id}: device step running "
                           f"{e.stalled_s + c.stall_factor * c.step_timeout_s:.1f} s (stalled)")
        elif (dead := e.dead_reason()) is not None:
            reasons.append(dead)
        else:
            reasons.append(f"engine {e.id} {e.state}" + (f": {e.last_error}" if e.last_error else ""))
    return JSONResponse({"status": "not ready", "reason": "; ".join(reasons), "engines": engines},
                        status_code=503)


@router.get("/metrics")
async def metrics_route(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
