"""The HTTP API (FastAPI): sessions, WebRTC signaling, RPCs, health, the demo page.

`create_app(config)` builds every object (model, session manager, device
worker) and hangs them on `app.state`; nothing lives at module level.

Routes:
    POST   /v1/sessions                 create a session   -> 201 {session_id, token, model[, livekit]}
    GET    /v1/sessions/{id}            session summary    (Bearer token of that session)
    DELETE /v1/sessions/{id}            close it           -> 204
    POST   /v1/sessions/{id}/webrtc     SDP offer -> answer (400 with the reason for a bad offer)
    POST   /v1/sessions/{id}/rpc        one control RPC    -> {id, result | error}; 204 for a notification
    WS     /v1/sessions/{id}/stream     fMP4 video + events out; actions, RPCs, directions in (ws_stream.py)
    WS     /ws                          the Dreamverse-compatible directing protocol (dreamverse*.py)
    GET    /status, /prompt-system-config, /curated-presets   Dreamverse's client's HTTP reads (dreamverse_http.py)
    GET    /v1/model                    the model's declared geometry
    GET    /v1/agent                    agent worker status (worldcast worker only)
    GET    /v1/engines[/{id}]           engine cores: device, pid, state, sessions, load (engine_api.py)
    POST   /v1/engines/{id}/drain       move its sessions off, stop placing on it (operator; also undrain)
    POST   /v1/sessions/{id}/move       move one session to another engine (operator)
    GET    /healthz, /readyz            liveness (with `service`); readiness (at least one engine alive and not stalled)
    GET    /metrics                     Prometheus text format
    GET    /                            the browser demo (web_demo/dist)
"""



import asyncio
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, HTTPException, Request, Response, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worldcast.engine.local_engine import LocalEngine
from worldcast.models.base import WorldModel
from worldcast.sessions.errors import CapacityExhausted, SessionError
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import CloseReason, Session, SessionState
from worldcast.transport import errors
from worldcast.transport.config import ServerConfig
from worldcast.transport.dreamverse_http import SERVICE as DREAMVERSE_SERVICE
from worldcast.transport.dreamverse_http import router as dreamverse_router
from worldcast.transport.dreamverse_serve import serve_dreamverse
from worldcast.transport.engine_api import add_engine_routes, build_engines
from worldcast.transport.http_body import BodyPolicy, RoutePolicy
from worldcast.transport.limits import InputGuard
from worldcast.transport.memory import HeapTrimmer, configure_malloc, freeze_startup_objects
from worldcast.transport.metrics import Metrics
from worldcast.transport.model_api import MAX_BODY_BYTES, create_body_limit, families_info, model_info, read_create_body
from worldcast.transport.peers import PeerRegistry
from worldcast.transport.rpc import RpcHandler, TokenBucket, error_reply
from worldcast.transport.schemas import (
    CreateSessionRequest,
    CreateSessionResponse,
    ModelFamilyInfo,
    ModelInfo,
    SdpAnswer,
    SdpOffer,
)
from worldcast.transport.sdp import InvalidOffer
from worldcast.transport.webrtc import (
    CONTROL_BURST,
    CONTROL_RATE_HZ,
    WebRTCPeer,
    configure_ice,
    quiet_closed_transport_errors,
)
from worldcast.transport.ws_stream import StreamSocketTuning, serve_stream

logger = logging.getLogger(__name__)

#: What an unknown id and a token that does not open the session both answer (the same for both).
NOT_FOUND_DETAIL = "no such session for this token"
#: Compared against when the id is unknown, so that both cases take the same time.
_NO_TOKEN = secrets.token_urlsafe(24)

_NO_DEMO = """<!doctype html><title>worldcast</title><h1>worldcast</h1>
<p>The browser demo is not built. Build it with <code>npm --prefix web_demo ci && npm --prefix web_demo run build</code>
(README's run command does this).</p>"""


def _printable(x: object, limit: int = 200) -> str:
    """A short, always-encodable rendering of an error fragment."""
    return str(x)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


#: The OpenAPI request body of POST /v1/sessions (parsed by `model_api.read_create_body`: JSON or multipart).
CREATE_REQUEST_BODY = {"required": False, "content": {
    "application/json": {"schema": CreateSessionRequest.model_json_schema()},
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "image": {"type": "string", "format": "binary"}, "prompt": {"type": "string"},
        "seed": {"type": "integer"}, "stamp_frames": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["interactive", "directing"]},
        "transport": {"type": "string", "enum": ["webrtc", "livekit"]}, "room": {"type": "string"}}}}}}


def _create_policy(scope: Any) -> RoutePolicy | None:
    """A create's body rule: JSON or multipart, up to the served model's largest starting image in base64."""
    if scope.get("method") == "POST" and scope.get("path") == "/v1/sessions":
        app = scope.get("app")
        return RoutePolicy(create_body_limit(getattr(getattr(app, "state", None), "model", None)),
                           frozenset({"multipart/form-data"}))
    return None


def create_app(config: ServerConfig, *, model: WorldModel | None = None) -> FastAPI:
    """Build the app. The model is loaded at startup unless one is passed in."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_ice(config.ice_host_addresses, consent_timeout_s=config.ice_consent_timeout_s)
        quiet_closed_transport_errors(asyncio.get_running_loop())
        configure_malloc(config.memory)  # before the model, the worker and the codecs allocate
        m = model if model is not None else config.load_model()
        manager = SessionManager(m, engine_config=config.engine, config=config.sessions,
                                 engines=build_engines(config, m))
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
        metrics.peer_count = lambda: len(peers)
        app.state.model, app.state.manager, app.state.peers, app.state.metrics = m, manager, peers, metrics
        app.state.streams = {}  # session id -> its WebSocket stream (ws_stream.StreamConnection)
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
            if app.state.agent_worker is not None:
                await app.state.agent_worker.aclose()
            if app.state.livekit is not None:
                await app.state.livekit.aclose()
            await manager.aclose()
            metrics.stop_listener()
            if trimmer is not None:
                trimmer.cancel()

    app = FastAPI(title="worldcast", version="0.1.0", lifespan=lifespan)

    app.add_middleware(BodyPolicy, max_bytes=MAX_BODY_BYTES, route_policy=_create_policy)  # 413 / 415
    app.add_middleware(StreamSocketTuning)  # outermost: it needs the server's own send

    @app.exception_handler(SessionError)
    async def _session_error(request: Request, exc: SessionError) -> JSONResponse:
        headers = {}
        if isinstance(exc, CapacityExhausted):
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))  # never earlier than true
        return JSONResponse({"detail": str(exc)}, status_code=errors.http_status(exc), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # the offending input is never echoed back: it may be huge, binary or not JSON-encodable
        errs = [{"loc": [_printable(x) for x in e.get("loc", ())], "msg": _printable(e.get("msg", "")),
                 "type": _printable(e.get("type", ""))} for e in exc.errors()[:10]]
        first = errs[0] if errs else {"loc": [], "msg": "invalid request"}
        loc = ".".join(first["loc"])
        return JSONResponse({"detail": f"{loc}: {first['msg']}", "errors": errs}, status_code=422)

    def manager_dep(request: Request) -> SessionManager:
        return request.app.state.manager

    def session_dep(
        session_id: str,
        request: Request,
        authorization: Annotated[str | None, Header()] = None,
    ) -> Session:
        # An unauthenticated caller learns nothing about which ids exist: no token is 401 whatever the id,
        # and an unknown id or a token of another session are the same 404, after the same comparison.
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:  # auth schemes are case-insensitive (RFC 7235, 2.1)
            raise HTTPException(401, "missing 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"})
        session = request.app.state.manager.sessions.get(session_id)
        open_ = session is not None and session.state != SessionState.CLOSED
        expected = session.token if open_ else _NO_TOKEN  # type: ignore[union-attr]
        if not secrets.compare_digest(token.encode(), expected.encode()) or not open_:
            raise HTTPException(404, NOT_FOUND_DETAIL)
        return session  # type: ignore[return-value]

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": DREAMVERSE_SERVICE}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
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
            if e.state == "ready" and e.stalled_s > 0:
                c = e.config
                reasons.append(f"engine {e.id}: device step running "
                               f"{e.stalled_s + c.stall_factor * c.step_timeout_s:.1f} s (stalled)")
            elif isinstance(e, LocalEngine) and not e.worker.alive:
                reasons.append(e.worker.last_error or "device worker stopped")
            else:
                reasons.append(f"engine {e.id} {e.state}" + (f": {e.last_error}" if e.last_error else ""))
        return JSONResponse({"status": "not ready", "reason": "; ".join(reasons), "engines": engines},
                            status_code=503)

    @app.get("/metrics")
    async def metrics_route(request: Request) -> Response:
        return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    add_engine_routes(app, config)
    app.include_router(dreamverse_router)  # GET /status, /prompt-system-config, /curated-presets

    @app.get("/v1/model", response_model=ModelInfo)
    async def get_model(request: Request) -> ModelInfo:
        return model_info(request.app.state.model)

    @app.get("/v1/models", response_model=list[ModelFamilyInfo])
    async def get_models() -> list[ModelFamilyInfo]:
        return families_info(config.model)

    @app.get("/v1/agent")
    async def agent_status(request: Request) -> dict[str, Any]:
        worker = request.app.state.agent_worker
        if worker is None:
            raise HTTPException(404, "this server is not a LiveKit agent worker (worldcast worker)")
        return worker.info()

    @app.post("/v1/sessions", status_code=201, response_model=CreateSessionResponse,
              openapi_extra={"requestBody": CREATE_REQUEST_BODY})
    async def create_session(
        manager: Annotated[SessionManager, Depends(manager_dep)],
        request: Request,
    ) -> CreateSessionResponse:
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
        s = await manager.create(prompt=body.prompt, image=image, seed=body.seed, stamp_frames=body.stamp_frames,
                                 mode=body.mode)
        livekit = None
        try:  # whatever fails from here on (or a client gone mid-request), nothing stays allocated
            if body.transport == "livekit":
                from worldcast.transport.livekit.world import LiveKitJoinError

                try:
                    livekit = await worlds.serve(s, room=body.room)
                except LiveKitJoinError as e:
                    raise HTTPException(502, str(e)) from None
            return CreateSessionResponse(session_id=s.id, token=s.token, model=model_info(manager.model),
                                         livekit=livekit)
        except HTTPException:
            manager.close(s.id, CloseReason.ERROR)
            raise
        except Exception as e:
            manager.close(s.id, CloseReason.ERROR)
            logger.exception("Session(%s): create failed", s.id)
            raise HTTPException(500, f"internal error while creating the session ({type(e).__name__}); "
                                     "nothing was kept") from None
        except BaseException:  # cancelled: the client went away mid-request
            manager.close(s.id, CloseReason.ERROR)
            raise

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session: Annotated[Session, Depends(session_dep)]) -> dict[str, Any]:
        return session.info()

    @app.delete("/v1/sessions/{session_id}", status_code=204)
    async def delete_session(
        session: Annotated[Session, Depends(session_dep)],
        request: Request,
    ) -> Response:
        await request.app.state.peers.close_session(session.id, "client")
        request.app.state.manager.close(session.id, CloseReason.CLIENT)
        return Response(status_code=204)

    @app.post("/v1/sessions/{session_id}/webrtc", response_model=SdpAnswer)
    async def webrtc_offer(
        offer: SdpOffer,
        session: Annotated[Session, Depends(session_dep)],
        request: Request,
    ) -> SdpAnswer:
        peers: PeerRegistry = request.app.state.peers
        try:
            answer = await peers.offer(session, offer.sdp)  # a bad offer leaves the current peer untouched
        except InvalidOffer as e:
            raise HTTPException(400, str(e)) from None
        except ValueError as e:
            raise HTTPException(400, _printable(e, 300)) from None
        return SdpAnswer(sdp=answer.sdp, type="answer")

    @app.post("/v1/sessions/{session_id}/rpc", responses={204: {"description": "a JSON-RPC 2.0 notification"}})
    async def rpc(
        body: Annotated[Any, Body()],
        session: Annotated[Session, Depends(session_dep)],
        request: Request,
    ) -> Response:
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

    @app.websocket("/v1/sessions/{session_id}/stream")
    async def stream(websocket: WebSocket, session_id: str) -> None:
        st = websocket.app.state
        await serve_stream(websocket, session_id, manager=st.manager, streams=st.streams,
                           video_scale=config.scale_for(st.model),
                           make_guard=st.make_guard, on_frames=st.metrics.on_stream_frames)

    @app.websocket("/ws")
    async def dreamverse(websocket: WebSocket) -> None:
        st = websocket.app.state
        await serve_dreamverse(websocket, manager=st.manager, video_scale=config.scale_for(st.model),
                               segment_s=config.dreamverse_segment_s,
                               session_timeout_s=config.dreamverse_session_timeout_s,
                               segment_cap=config.dreamverse_segment_cap, make_guard=st.make_guard,
                               on_frames=st.metrics.on_stream_frames)

    if config.static_dir is not None and (config.static_dir / "index.html").exists():
        app.mount("/", StaticFiles(directory=config.static_dir, html=True), name="demo")
    else:

        @app.get("/", response_class=HTMLResponse)
        async def no_demo() -> str:
            return _NO_DEMO

    return app
