"""Scale-out through LiveKit's explicit dispatch: two real `worldcast worker` processes (2 sessions
each) registered with one real livekit-server; LiveKit places the rooms, and a dispatch that no
worker can take is declined and its room is told."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.conftest import free_port
from worldcast.transport.livekit.config import LiveKitConfig, SourceKind

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

lk = pytest.importorskip("livekit.api")

#: Sessions each worker admits (static admission).
PER_WORKER = 2
#: How long a worker process may take to load, warm up and register, s.
START_TIMEOUT_S = 150.0


@dataclass
class WorkerProcess:
    url: str
    worker_id: str
    proc: subprocess.Popen  # type: ignore[type-arg]
    log: str

    def info(self) -> dict:  # type: ignore[type-arg]
        return httpx.get(f"{self.url}/v1/agent", timeout=5).json()


@contextlib.contextmanager
def worker_processes(livekit_server, n: int) -> Iterator[list[WorkerProcess]]:  # type: ignore[no-untyped-def]
    """Start `n` `worldcast worker` processes at once; yield when all are registered."""
    started = []
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    try:
        for _ in range(n):
            port = free_port()
            log = tempfile.NamedTemporaryFile("w+", prefix="worldcast-worker-", suffix=".log", delete=False)  # noqa: SIM115
            cmd = [sys.executable, "-m", "worldcast.transport.cli", "worker", "--host", "127.0.0.1",
                   "--port", str(port), "--ice-host", "127.0.0.1", "--url", livekit_server.url,
                   "--livekit-api-key", livekit_server.api_key, "--livekit-api-secret", livekit_server.api_secret,
                   "--admission", "static", "--max-sessions", str(PER_WORKER), "--video-scale", "2",
                   "--threads", "1", "--max-batch", "2", "--kv-budget-mib", "64", "--log-level", "info"]
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            started.append((f"http://127.0.0.1:{port}", proc, log))
        workers = []
        deadline = time.monotonic() + START_TIMEOUT_S
        for url, proc, log in started:
            while True:
                assert proc.poll() is None, f"worker exited: {open(log.name).read()[-3000:]}"
                assert time.monotonic() < deadline, f"worker not registered: {open(log.name).read()[-3000:]}"
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    info = httpx.get(f"{url}/v1/agent", timeout=2).json()
                    if info.get("registered"):
                        workers.append(WorkerProcess(url, info["worker_id"], proc, log.name))
                        break
                time.sleep(0.2)
        yield workers
    finally:
        for _, proc, _ in started:
            if proc.poll() is None:
                proc.terminate()
        for _, proc, log in started:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def user_token(livekit_server, room: str, identity: str) -> str:  # type: ignore[no-untyped-def]
    from worldcast.transport.livekit import tokens

    cfg = LiveKitConfig(url=livekit_server.url, api_key=livekit_server.api_key,
                        api_secret=livekit_server.api_secret, source=SourceKind.RAW)
    return tokens.user_token(cfg, room=room, identity=identity)


async def test_dispatch_fills_workers_by_load_and_declines_when_all_are_full(livekit_server) -> None:  # type: ignore[no-untyped-def]
    from livekit import api

    from worldcast.transport.clients.livekit import LiveKitUser

    with worker_processes(livekit_server, 2) as workers:
        ids = {w.worker_id: w for w in workers}
        lkapi = api.LiveKitAPI(livekit_server.http_url, livekit_server.api_key, livekit_server.api_secret)
        users: list[LiveKitUser] = []

        async def dispatch(room: str, identity: str) -> tuple[LiveKitUser, api.AgentDispatch]:
            u = await LiveKitUser.join(livekit_server.url, user_token(livekit_server, room, identity))
            users.append(u)
            d = await lkapi.agent_dispatch.create_dispatch(api.CreateAgentDispatchRequest(
                agent_name="worldcast", room=room, metadata=json.dumps({"user_identity": identity})))
            return u, d

        try:
            placed = []
            for i in range(2 * PER_WORKER):
                u, _ = await dispatch(f"disp-{i}", f"user-{i}")
                world = await u.wait_world(30)
                await u.next_frame(30)  # the world streams to its user
                worker_id = u.room.remote_participants[world].attributes.get("worldcast.worker")
                assert worker_id in ids, (worker_id, ids)
                placed.append(worker_id)
                # the worker's own account: it holds that job
                deadline = time.monotonic() + 10
                while placed.count(worker_id) != len(ids[worker_id].info()["jobs"]):
                    assert time.monotonic() < deadline, ids[worker_id].info()
                    await asyncio.sleep(0.1)
            # every room got a world; once a worker was full, the next rooms went to the other
            assert sorted(collections.Counter(placed).values()) == [PER_WORKER, PER_WORKER], placed
            assert all(not w.info()["admits"] for w in workers)

            # both full: the next dispatch is declined and its user is told (not left waiting)
            u, d = await dispatch("disp-full", "user-full")
            notice = await u.wait_event(lambda m: m.get("event") == "dispatch_declined", timeout_s=30)
            assert notice["dispatch_id"] == d.id and notice["agent_name"] == "worldcast"
            assert "capacity" in notice["reason"] and notice["retry_after_s"] > 0
            assert not any(p.startswith("worldcast-") for p in u.room.remote_participants)
            assert sum(w.info()["declined"] for w in workers) >= 1

            # a user leaves: its worker frees the slot, and a new dispatch lands there
            first = users[0]
            freed = placed[0]
            await first.aclose()
            deadline = time.monotonic() + 15
            while not ids[freed].info()["admits"]:
                assert time.monotonic() < deadline, "slot not freed after the user left"
                await asyncio.sleep(0.1)
            u2, _ = await dispatch("disp-again", "user-again")
            world = await u2.wait_world(30)
            assert u2.room.remote_participants[world].attributes.get("worldcast.worker") == freed
        finally:
            for u in users:
                with contextlib.suppress(Exception):
                    await u.aclose()
            await lkapi.aclose()
