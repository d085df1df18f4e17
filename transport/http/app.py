"""The HTTP API (FastAPI): the app's wiring and lifespan; the routes are routers by surface (`routes/`).

`create_app(config)` builds every object (model, session manager, engines, peers, LiveKit worlds, metrics)
at startup and hangs them on `app.state`; nothing lives at module level.

Routes (`transport/http/routes/`):
    POST   /v1/sessions                 create a session   -> 201 {session_id, token, model[, livekit]}   sessions.py
    GET    /v1/sessions/{id}            session summary    (Bearer token of that session)                  sessions.py
    DELETE /v1/sessions/{id}            close it           -> 204                                          sessions.py
    POST   /v1/sessions/{id}/rpc        one control RPC    -> {id, result | error}; 204 for a notification sessions.py
    POST   /v1/sessions/{id}/viewers    mint a viewer token -> 201 {viewer_id, viewer_token, whep_url, ...} viewers.py
    DELETE /v1/sessions/{id}/viewers/{v} revoke it (its streams are closed) -> 204                          viewers.py
    POST   /v1/sessions/{id}/webrtc     SDP offer -> answer (400 with the reason for a bad offer)          webrtc.py
    POST   /v1/sessions/{id}/whep       WHEP: SDP offer -> 201 answer, Location; DELETE/OPTIONS the resource whep.py
    WS     /v1/sessions/{id}/stream     fMP4 video + events out; actions, RPCs, directions in              streams.py
    WS     /ws                          the Dreamverse-compatible directing protocol                       streams.py
    GET    /status, /prompt-system-config, /curated-presets   Dreamverse's client's HTTP reads           streams.py
    GET    /v1/model, /v1/models        the model's declared geometry; the model families                 admin.py
    GET    /v1/agent                    agent worker status (worldcast worker only)                        admin.py
    GET    /v1/engines[/{id}]           engine cores: id, state; with the admin token also pid, sessions, load   admin.py
    POST   /v1/engines/{id}/drain       move its sessions off, stop placing on it (operator; also undrain) admin.py
    POST   /v1/sessions/{id}/move       move one session to another engine (operator)                      admin.py
    GET    /healthz, /readyz            liveness (with `service`); readiness                               health.py
    GET    /metrics                     Prometheus text format                                             health.py
    GET    /                            the browser demo (web_demo/dist)                                   here
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from worldcast.engine.memory import freeze_startup_objects
from worldcast.models.base import WorldModel
from worldcast.sessions.errors import CapacityExhausted, SessionError, SpectatorRefused
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.recording import Recordings
from worldcast.sessions.session import Session
from worldcast.sessions.snapshots import SnapshotStore
from worldcast.transport import errors
from worldcast.transport.config import ServerConfig
from worldcast.transport.http.body import BodyPolicy, RoutePolicy
from worldcast.transport.http.engine_api import build_engines
from worldcast.transport.http.metrics import Metrics
from worldcast.transport.http.model_api import MAX_BODY_BYTES, create_body_limit
from worldcast.transport.http.routes import (
    admin,
    health,
    recordings,
    sessions,
    snapshots,
    streams,
    viewers,
    webrtc,
    whep,
)
from worldcast.transport.http.routes.deps import printable
from worldcast.transport.limits import InputGuard
from worldcast.transport.memory import HeapTrimmer, configure_malloc
from worldcast.transport.stream.connection import StreamSocketTuning
from worldcast.transport.stream.recording import RecordingVideo
from worldcast.transport.webrtc.peer import WebRTCPeer, configure_ice, quiet_closed_transport_errors
from worldcast.transport.webrtc.registry import PeerRegistry
from worldcast.transport.webrtc.whep import WhepResources

logger = logging.getLogger(__name__)

_NO_DEMO = """<!doctype html><title>worldcast</title><h1>worldcast</h1>
<p>The browser demo is not built. Build it with <code>npm --prefix web_demo ci && npm --prefix web_demo run build</code>
(README's run command does this).</p>"""


def _create_policy(scope: Any) -> RoutePolicy | None:
    """The routes' own body rules: a create takes JSON or multipart, up to the served model's largest starting
    image in base64; WHEP takes SDP (a PATCH also a trickle-ICE fragment, to be answered 405), not JSON."""
    if scope.get("method") == "POST" and scope.get("path") == "/v1/sessions":
        app = scope.get("app")
        return RoutePolicy(create_body_limit(getattr(getattr(app, "state", None), "model", None)),
                           frozenset({"multipart/form-data"}))
    if whep.is_whep_path(scope.get("path", "")):
        types = {whep.SDP_TYPE} | ({whep.TRICKLE_TYPE} if scope.get("method") == "PATCH" else set())
        return RoutePolicy(whep.MAX_OFFER_BYTES, frozenset(types), json=False)
    return None


def create_app(config: ServerConfig, *, model: WorldModel | None = None) -> FastAPI:
    """Build the app. The model is loaded at startup unless one is passed in."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_ice(config.ice_host_addresses, consent_timeout_s=config.ice_consent_timeout_s)
        quiet_closed_transport_errors(asyncio.get_running_loop())
        configure_malloc(config.memory)  # before the model, the worker and the codecs allocate
        m = model if model is not None else config.load_model()
        store = None if config.recordings is None else Recordings(
            config.recordings, identity={"model": config.model,
                                         "weights": None if config.weights is None else str(config.weights)},
            video=lambda s, path: RecordingVideo(
                s, path, scale=config.scale_for(m), max_bytes=config.recordings.max_session_bytes,  # type: ignore[union-attr]
                on_stop=lambda reason: s.recording.fail(f"its video stopped: {reason}") if s.recording else None))
        manager = SessionManager(m, engine_config=config.engine, config=config.sessions,
                                 engines=build_engines(config, m), recordings=store,
                                 snapshots=None if config.snapshots is None else SnapshotStore(
                                     config.snapshots, model_name=m.spec.name))
        trimmer = None
        if config.memory.trim_after_close_s is not None:  # give a peak's freed heap back once closes settle
            trimmer = HeapTrimmer(config.memory.trim_after_close_s)
            manager.on_close = lambda s: trimmer.schedule()
        app.state.heap_trimmer = trimmer
        metrics = Metrics(manager, config.metrics)
        manager.on_frame, manager.on_admission, manager.on_engine_lost = (
            metrics.on_frame, metrics.on_admission, metrics.on_engine_lost)
        for e in manager.engines:
            e.on_step = metrics.on_step
        try:
            await manager.start()
        except BaseException:
            await manager.aclose()  # engines that did start
            raise
        port = metrics.start_listener()
        app.state.metrics_port = port  # the bound port (config.metrics.port 0: an ephemeral one)
        if port is not None:
            logger.info("worldcast: metrics on http://%s:%d/metrics%s", config.metrics.host, port,
                        " (with per-session series)" if config.metrics.per_session else "")

        def make_peer(session: Session, **callbacks: Any) -> WebRTCPeer:
            return WebRTCPeer(session, video_scale=config.scale_for(m),
                              limits=config.input_limits, negotiation_timeout_s=config.negotiation_timeout_s,
                              on_count=metrics.on_input, **callbacks)

        def make_guard() -> InputGuard:  # the WebSocket streams' and LiveKit worlds' limits and counters
            return InputGuard(config.input_limits, on_count=metrics.on_input)

        peers = PeerRegistry(make_peer, on_close=metrics.on_peer_close)
        app.state.whep = WhepResources(manager.sessions, config=config.viewers, video_scale=config.scale_for(m),
                                       negotiation_timeout_s=config.negotiation_timeout_s)
        metrics.peer_count = lambda: len(peers)
        app.state.model, app.state.manager, app.state.peers, app.state.metrics = m, manager, peers, metrics
        app.state.streams = {}  # session id -> its WebSocket stream (stream/connection.StreamConnection)
        app.state.rpc_buckets = {}  # session id -> the TokenBucket of its HTTP RPCs
        app.state.image_decodes = asyncio.Semaphore(1)  # starting images decoded one at a time
        app.state.make_guard = make_guard
        app.state.livekit = None
        if config.livekit is not None:
            from worldcast.transport.livekit.world import LiveKitWorlds

            app.state.livekit = LiveKitWorlds(config.livekit, manager, video_scale=config.scale_for(m),
                                              make_guard=make_guard)
        app.state.agent_worker = None
        if config.agent is not None:
            from worldcast.transport.livekit.worker import AgentWorker

            app.state.agent_worker = AgentWorker(config.agent, config.livekit, manager, app.state.livekit)
            app.state.agent_worker.start()
        if trimmer is not None:  # start-up's objects (model, libraries) are never scanned again
            frozen = freeze_startup_objects()
            logger.debug("worldcast: %d start-up objects frozen out of the collector", frozen)
        logger.info("worldcast: serving %s on %d engine(s) (%s)", m.spec.name, len(manager.engines),
                    ", ".join(f"{e.device}{' in its own process' if e.process else ''}" for e in manager.engines))
        try:
            yield
        finally:
            await peers.aclose()
            await app.state.whep.aclose()
            if app.state.agent_worker is not None:
                await app.state.agent_worker.aclose()
            if app.state.livekit is not None:
                await app.state.livekit.aclose()
            await manager.aclose()
            metrics.stop_listener()
            if trimmer is not None:
                trimmer.cancel()

    app = FastAPI(title="worldcast", version="0.1.0", lifespan=lifespan)
    app.state.config = config
    app.state.admin_token = config.admin_token  # the operator routes' (`engine_api.py`)

    app.add_middleware(BodyPolicy, max_bytes=MAX_BODY_BYTES, route_policy=_create_policy)  # 413 / 415
    app.add_middleware(whep.WhepCors)  # outside BodyPolicy: its refusals of WHEP requests carry CORS too
    app.add_middleware(StreamSocketTuning)  # outermost: it needs the server's own send

    @app.exception_handler(SessionError)
    async def _session_error(request: Request, exc: SessionError) -> JSONResponse:
        headers = {}
        if isinstance(exc, CapacityExhausted | SpectatorRefused):
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))  # never earlier than true
        return JSONResponse({"detail": str(exc)}, status_code=errors.http_status(exc), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # the offending input is never echoed back: it may be huge, binary or not JSON-encodable
        errs = [{"loc": [printable(x) for x in e.get("loc", ())], "msg": printable(e.get("msg", "")),
                 "type": printable(e.get("type", ""))} for e in exc.errors()[:10]]
        first = errs[0] if errs else {"loc": [], "msg": "invalid request"}
        loc = ".".join(first["loc"])
        return JSONResponse({"detail": f"{loc}: {first['msg']}", "errors": errs}, status_code=422)

    for r in (sessions.router, viewers.router, webrtc.router, whep.router, streams.router, recordings.router,
              snapshots.router, admin.router, health.router):
        app.include_router(r)

    if config.static_dir is not None and (config.static_dir / "index.html").exists():
        app.mount("/", StaticFiles(directory=config.static_dir, html=True), name="demo")
    else:

        @app.get("/", response_class=HTMLResponse)
        async def no_demo() -> str:
            return _NO_DEMO

    return app
