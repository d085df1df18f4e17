"""AgentWorker: this server as a LiveKit agent worker, placed by LiveKit's explicit dispatch.

The protocol (livekit-server pkg/service/agentservice.go and pkg/agent/worker.go,
messages from livekit/protocol `livekit_agent.proto`, binary protobuf frames
over one WebSocket to `<url>/agent?protocol=1`, Bearer token with the `agent`
grant):

1. the worker sends `RegisterWorkerRequest` (type JT_ROOM, `agent_name`); the
   server answers `RegisterWorkerResponse` with the worker id;
2. the worker sends `UpdateWorkerStatus` (status, load in [0, 1], job count)
   on every change and every `status_interval_s`;
3. for a dispatch, the server picks among AVAILABLE workers of that agent name at
   random, weighted by max(0, 1 - load), and sends that worker an
   `AvailabilityRequest`; a worker that answers `available=False` is skipped and
   the next is tried; when none is left the dispatch is dropped, silently;
4. to an `available=True` answer (with our participant identity) the server
   replies `JobAssignment` (job, URL, a room token for that identity); the
   worker joins the room and reports `UpdateJobStatus` RUNNING, later SUCCESS
   or FAILED; `JobTermination` asks it to stop.

The server only routes a job request to a node at all when some AVAILABLE
worker there has load below `agents.target_load` (default 0.7): the node
claims the request with affinity sum(max(0, target_load - load)), and psrpc
takes no claim of affinity 0 (psrpc pkg/client/rpc.go).

Load and admission: the load is the admission controller's (`worker_load`),
scaled into [0, OPEN_LOAD_SCALE] while admitting. When admission would
refuse, the worker stays AVAILABLE at `FULL_LOAD` (under the target load)
rather than reporting WS_FULL: a WS_FULL worker is never asked, so with
every worker full LiveKit would drop the dispatch without anyone hearing of
it. Asked, a full worker declines (LiveKit moves on to the others) and, if after
`decline_watch_s` no worker took the dispatch, tells the room: a reliable
data packet on topic `worldcast.dispatch`,
`{"event": "dispatch_declined", "dispatch_id", "agent_name", "reason", "retry_after_s"}`,
sent through the server API (RoomService.SendData).

Accepting reserves the session at once (so two requests cannot both take the
last slot); it is closed if no assignment follows within `assignment_timeout_s`.
Dispatch metadata may be a JSON object `DispatchMetadata`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import websockets
from livekit import api
from livekit.protocol import agent as pb
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from worldcast.engine.admission import AdmissionPolicy
from worldcast.sessions.errors import CapacityExhausted
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import CloseReason, Session
from worldcast.transport.errors import LiveKitJoinError
from worldcast.transport.livekit.config import AgentWorkerConfig, LiveKitConfig
from worldcast.transport.livekit.tokens import agent_token, world_identity
from worldcast.transport.livekit.world import LiveKitWorld, LiveKitWorlds
from worldcast.transport.schemas import MAX_PROMPT_CHARS, check_prompt

logger = logging.getLogger(__name__)

#: Load reported while admission would refuse: under livekit-server's default `agents.target_load`
#: (0.7), so LiveKit still asks (and we decline and tell the room).
FULL_LOAD = 0.65
#: Loads reported while admitting lie in [0, OPEN_LOAD_SCALE] (the admission share, scaled).
OPEN_LOAD_SCALE = 0.6
#: Data topic of dispatch notices to a room.
DISPATCH_TOPIC = "worldcast.dispatch"
#: Participant attribute naming the worker that serves a world.
WORKER_ATTRIBUTE = "worldcast.worker"
#: Protocol version sent on connecting (livekit-server pkg/agent/worker.go CurrentProtocol).
PROTOCOL_VERSION = 1


class DispatchMetadata(BaseModel):
    """Optional JSON object in a dispatch's metadata (CreateAgentDispatchRequest.metadata)."""

    model_config = ConfigDict(extra="forbid")

    user_identity: str | None = Field(None, min_length=1, max_length=256,
                                      description="the session's user (default: the first non-agent participant)")
    prompt: str | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS)
    seed: StrictInt | None = Field(None, ge=0, le=2**31 - 1)
    stamp_frames: StrictBool = False

    @classmethod
    def parse(cls, text: str) -> DispatchMetadata:
        """Parse metadata ('' means none).

        Raises:
            ValueError: not a JSON object of this schema (the message says what).
        """
        if not text.strip():
            return cls()
        try:
            m = cls.model_validate_json(text)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"dispatch metadata: {'.'.join(str(x) for x in err['loc']) or 'body'}: "
                             f"{err['msg']}") from None
        try:
            prompt = check_prompt(m.prompt)  # the one prompt rule of every surface
        except ValueError as e:
            raise ValueError(f"dispatch metadata: prompt: {e}") from None
        return m.model_copy(update={"prompt": prompt})


def worker_load(manager: SessionManager) -> tuple[bool, float]:
    """(admits, load): whether admission would take one more session, and the load to report.

    Load is the larger of the open sessions' share of `max_sessions` and, for the
    duty-cycle and always-on policies, the expected sessions generating at once over
    what the device carries, capped at 1 and scaled by OPEN_LOAD_SCALE while admitting;
    FULL_LOAD otherwise.
    """
    d = manager.admission_decision()
    if not d.admitted:
        return False, FULL_LOAD
    adm = manager.config.admission
    load = len(manager.sessions) / adm.max_sessions
    if adm.policy != AdmissionPolicy.STATIC and d.active_capacity > 0:
        newcomer = manager.duty_prior.value(manager.measured_loads())
        load = max(load, (d.expected_active - newcomer) / d.active_capacity)
    return True, OPEN_LOAD_SCALE * min(1.0, max(0.0, load))


@dataclass
class _Job:
    job: pb.Job
    session: Session
    meta: DispatchMetadata
    accepted_s: float
    world: LiveKitWorld | None = None
    timeout: asyncio.TimerHandle | None = field(default=None, repr=False)


class AgentWorker:
    """Registers with LiveKit and serves its dispatched rooms as worlds.

    Args:
        config: worker settings.
        livekit: the LiveKit server and keys.
        manager: sessions (admission decides).
        worlds: where the worlds live.
    """

    def __init__(self, config: AgentWorkerConfig, livekit: LiveKitConfig, manager: SessionManager,
                 worlds: LiveKitWorlds) -> None:
        self.config, self.livekit, self.manager, self.worlds = config, livekit, manager, worlds
        self.worker_id: str | None = None
        self.registered = asyncio.Event()
        self.jobs: dict[str, _Job] = {}  #: by job id, accepted (pending assignment) or running
        self.declined = 0
        self._ws: Any = None
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._api: api.LiveKitAPI | None = None
        self._closing = False
        self._last_status: tuple[int, float, int] | None = None
        worlds.on_ended = self._world_ended

    def info(self) -> dict[str, Any]:
        """JSON-able status (GET /v1/agent)."""
        admits, load = worker_load(self.manager)
        return {"agent_name": self.config.agent_name, "registered": self.registered.is_set(),
                "worker_id": self.worker_id, "admits": admits, "load": round(load, 4),
                "jobs": sorted(self.jobs), "declined": self.declined}

    # -- connection ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect and register in the background (reconnecting with backoff)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="livekit-agent-worker")

    async def _run(self) -> None:
        backoff = self.config.reconnect_min_s
        while not self._closing:
            try:
                await self._connect_once()
                backoff = self.config.reconnect_min_s
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure: reconnect
                logger.warning("AgentWorker: connection to %s failed: %s: %s; retrying in %.1f s",
                               self.livekit.ws_url, type(e).__name__, e, backoff)
            self.registered.clear()
            if self._closing:
                return
            await asyncio.sleep(backoff)
            backoff = min(self.config.reconnect_max_s, backoff * 2)

    async def _connect_once(self) -> None:
        url = f"{self.livekit.ws_url.rstrip('/')}/agent?protocol={PROTOCOL_VERSION}"
        headers = {"Authorization": f"Bearer {agent_token(self.livekit)}"}
        async with websockets.connect(url, additional_headers=headers, open_timeout=10,
                                      max_size=1 << 20) as ws:
            self._ws = ws
            await self._send(pb.WorkerMessage(register=pb.RegisterWorkerRequest(
                type=pb.JT_ROOM, agent_name=self.config.agent_name, version="worldcast")))
            first = pb.ServerMessage.FromString(await asyncio.wait_for(ws.recv(), 10))
            if first.WhichOneof("message") != "register":
                raise ConnectionError(f"expected a register response, got {first.WhichOneof('message')}")
            self.worker_id = first.register.worker_id
            self.registered.set()
            self._last_status = None
            logger.info("AgentWorker: registered as %s (agent %r) at %s", self.worker_id, self.config.agent_name,
                        self.livekit.ws_url)
            status = asyncio.get_running_loop().create_task(self._status_loop(), name="livekit-agent-status")
            try:
                async for raw in ws:
                    if isinstance(raw, bytes):
                        self._dispatch(pb.ServerMessage.FromString(raw))
            finally:
                status.cancel()
                self._ws = None

    async def _send(self, msg: pb.WorkerMessage) -> None:
        if self._ws is not None:
            await self._ws.send(msg.SerializeToString())

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro, name="livekit-agent-job")
        self._tasks.add(t)
        t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            logger.error("AgentWorker: %s failed: %r", t.get_name(), t.exception())

    # -- status ---------------------------------------------------------------------------------------

    async def _status_loop(self) -> None:
        while True:
            await self.send_status(force=True)
            await asyncio.sleep(self.config.status_interval_s)

    async def send_status(self, *, force: bool = False) -> None:
        """Report status, load and job count (when changed, or `force`)."""
        _, load = worker_load(self.manager)
        now = (pb.WS_AVAILABLE, round(load, 4), len(self.jobs))
        if not force and now == self._last_status:
            return
        self._last_status = now
        await self._send(pb.WorkerMessage(update_worker=pb.UpdateWorkerStatus(
            status=now[0], load=now[1], job_count=now[2])))

    # -- server messages --------------------------------------------------------------------------------

    def _dispatch(self, msg: pb.ServerMessage) -> None:
        kind = msg.WhichOneof("message")
        if kind == "availability":
            self._spawn(self._on_availability(msg.availability.job))
        elif kind == "assignment":
            self._spawn(self._on_assignment(msg.assignment))
        elif kind == "termination":
            self._on_termination(msg.termination.job_id)
        elif kind in ("pong", "register"):
            pass
        else:
            logger.info("AgentWorker: ignoring server message %s", kind)

    async def _answer(self, job_id: str, **kw: Any) -> None:
        await self._send(pb.WorkerMessage(availability=pb.AvailabilityResponse(job_id=job_id, **kw)))

    async def _on_availability(self, job: pb.Job) -> None:
        room = job.room.name
        try:
            meta = DispatchMetadata.parse(job.metadata)
        except ValueError as e:
            await self._decline(job, str(e), retry_after_s=0.0)
            return
        admits, _ = worker_load(self.manager)
        if not admits:
            d = self.manager.admission_decision()
            await self._decline(job, f"worker at capacity: {d.reason}", retry_after_s=d.retry_after_s)
            return
        try:
            session = await self.manager.create(prompt=meta.prompt, seed=meta.seed, stamp_frames=meta.stamp_frames)
        except CapacityExhausted as e:
            await self._decline(job, f"worker at capacity: {e}", retry_after_s=e.retry_after_s)
            return
        entry = _Job(job, session, meta, time.monotonic())
        self.jobs[job.id] = entry
        entry.timeout = asyncio.get_running_loop().call_later(
            self.config.assignment_timeout_s, self._assignment_overdue, job.id)
        await self._answer(job.id, available=True, participant_identity=world_identity(session.id),
                           participant_name="worldcast",
                           participant_attributes={WORKER_ATTRIBUTE: self.worker_id or ""})
        logger.info("AgentWorker: accepted job %s (room %r) as session %s", job.id, room, session.id)
        await self.send_status()

    async def _decline(self, job: pb.Job, reason: str, *, retry_after_s: float) -> None:
        self.declined += 1
        await self._answer(job.id, available=False)
        logger.info("AgentWorker: declined job %s (room %r, dispatch %s): %s", job.id, job.room.name,
                    job.dispatch_id, reason)
        self._spawn(self._tell_if_unplaced(job, reason, retry_after_s))

    def _assignment_overdue(self, job_id: str) -> None:
        entry = self.jobs.get(job_id)
        if entry is not None and entry.world is None:
            logger.info("AgentWorker: no assignment for job %s within %.0f s; releasing session %s", job_id,
                        self.config.assignment_timeout_s, entry.session.id)
            self.jobs.pop(job_id, None)
            self.manager.close(entry.session.id, CloseReason.CLIENT)

    async def _on_assignment(self, a: pb.JobAssignment) -> None:
        entry = self.jobs.get(a.job.id)
        if entry is None:
            await self._job_status(a.job.id, pb.JS_FAILED, "assignment for a job this worker did not accept")
            return
        if entry.timeout is not None:
            entry.timeout.cancel()
        try:
            entry.world = await self.worlds.open(entry.session, room=a.job.room.name,
                                                 user_identity=entry.meta.user_identity,
                                                 url=a.url or None, token=a.token)
        except Exception as e:  # noqa: BLE001 - LiveKitJoinError or anything else: nothing stays allocated
            self.jobs.pop(a.job.id, None)
            why = str(e) if isinstance(e, LiveKitJoinError) else f"{type(e).__name__}: {e}"
            self.manager.close(entry.session.id, CloseReason.ERROR, detail=f"the world could not join: {why}")
            await self._job_status(a.job.id, pb.JS_FAILED, why)
            return
        await self._job_status(a.job.id, pb.JS_RUNNING)

    def _on_termination(self, job_id: str) -> None:
        entry = self.jobs.get(job_id)
        if entry is not None:
            logger.info("AgentWorker: job %s terminated by the server", job_id)
            self.manager.close(entry.session.id, CloseReason.CLIENT)

    def _world_ended(self, world: LiveKitWorld) -> None:
        for job_id, entry in list(self.jobs.items()):
            if entry.session is world.session:
                self.jobs.pop(job_id, None)
                self._spawn(self._job_status(job_id, pb.JS_SUCCESS))
        self._spawn(self.send_status())

    async def _job_status(self, job_id: str, status: int, error: str = "") -> None:
        await self._send(pb.WorkerMessage(update_job=pb.UpdateJobStatus(job_id=job_id, status=status, error=error)))
        await self.send_status()

    # -- telling a room its dispatch found no worker ------------------------------------------------

    def _server_api(self) -> api.LiveKitAPI:
        if self._api is None:
            self._api = api.LiveKitAPI(self.livekit.http_url, self.livekit.api_key, self.livekit.api_secret)
        return self._api

    async def _tell_if_unplaced(self, job: pb.Job, reason: str, retry_after_s: float) -> None:
        """After declining: if within `decline_watch_s` no worker took the dispatch, tell the room."""
        lk = self._server_api()
        deadline = time.monotonic() + self.config.decline_watch_s
        while time.monotonic() < deadline:
            await asyncio.sleep(self.config.decline_poll_s)
            try:
                dispatches = await lk.agent_dispatch.list_dispatch(job.room.name)
            except Exception as e:  # noqa: BLE001 - the room may be gone
                logger.info("AgentWorker: cannot list dispatches of room %r: %r", job.room.name, e)
                return
            mine = [d for d in dispatches if d.id == job.dispatch_id]
            if job.dispatch_id and not mine:
                return  # deleted meanwhile
            if any(j.state.participant_identity for d in mine for j in d.state.jobs):
                return  # another worker took it
        notice = {"event": "dispatch_declined", "dispatch_id": job.dispatch_id, "agent_name": job.agent_name,
                  "reason": reason, "retry_after_s": retry_after_s}
        try:
            await lk.room.send_data(api.SendDataRequest(
                room=job.room.name, data=json.dumps(notice).encode(), kind=api.DataPacket.Kind.RELIABLE,
                topic=DISPATCH_TOPIC))
            logger.info("AgentWorker: told room %r that dispatch %s found no worker", job.room.name,
                        job.dispatch_id)
        except Exception as e:  # noqa: BLE001
            logger.info("AgentWorker: could not tell room %r: %r", job.room.name, e)

    # -- teardown -------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Deregister (close the socket) and stop (idempotent); worlds are closed by their owner."""
        self._closing = True
        for entry in list(self.jobs.values()):
            if entry.timeout is not None:
                entry.timeout.cancel()
        if self._ws is not None:
            await self._ws.close()
        tasks = [t for t in [self._task, *self._tasks] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        if self._api is not None:
            await self._api.aclose()
            self._api = None
