"""Connect/disconnect cycles: every way a client can leave, then a leak and reaping audit.

    python -m tests.cycles --cycles 100 [--out cycles.json]

Cycle kinds, in rotation:
- clean: connect, get a frame, DELETE, close;
- no_delete: connect, get a frame, close the peer without DELETE;
- killed: a client in its own process connects and gets a frame, then is killed (SIGKILL);
- never_connected: POST an offer, never apply the answer, close the peer;
- racing_delete: POST an offer and DELETE the session 0-12 ms later.

After the cycles it waits for every session to be reaped and checks, in the server process: no peer
connections left (the server's registry and every RTCPeerConnection object), no more asyncio tasks on the
server's loop, threads or file descriptors than after a warm-up round of each kind, and every session
closed within its stated bound after its client left: 0 for DELETE kinds, else the time its peer takes
to end (ICE consent timeout for a silent client) plus the session timeout (reconnect grace) and one
housekeeping tick; for one that never connects, its negotiation timeout (it never had a viewer, so no
reconnect grace) and a tick. The server runs in-process with short timeouts (`CONFIG`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

KINDS = ("clean", "no_delete", "killed", "never_connected", "racing_delete")
NEGOTIATION_TIMEOUT_S = 2.0
CONSENT_TIMEOUT_S = 3.0
SESSION_TIMEOUT_S = 1.0  #: reconnect grace: a session whose viewer left is closed this long after
CONNECT_GRACE_S = 1.0  #: a session that never had a viewer is closed this long after creation (or its offer's end)
TICK_S = 0.2
#: slack on every reaping bound, s (a shared 2-core machine)
SLACK_S = 5.0
#: longest a silent peer keeps consent: its checks run every 0.8-1.2 x interval and each waits 0.5 s (aioice)
CONSENT_BOUND_S = 1.2 * CONSENT_TIMEOUT_S + 3 * 0.5
BOUND_S = {
    "clean": 0.0, "racing_delete": 0.0,
    "no_delete": CONSENT_BOUND_S + SESSION_TIMEOUT_S + TICK_S,
    "killed": CONSENT_BOUND_S + SESSION_TIMEOUT_S + TICK_S,
    # never a viewer: released when its connecting peer's negotiation timeout ends (or the connect grace)
    "never_connected": max(NEGOTIATION_TIMEOUT_S, CONNECT_GRACE_S) + TICK_S,
}


def cycle_config() -> Any:
    from tests.conftest import server_config
    from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
    from worldcast.sessions.manager import SessionConfig

    return replace(server_config(), negotiation_timeout_s=NEGOTIATION_TIMEOUT_S,
                   ice_consent_timeout_s=CONSENT_TIMEOUT_S,
                   sessions=SessionConfig(idle_after_s=600.0, timeout_s=SESSION_TIMEOUT_S, tick_s=TICK_S,
                                          connect_grace_s=CONNECT_GRACE_S,
                                          admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=64)))


@dataclass
class CycleReport:
    """What the cycles left behind. Counts are the server process's, after minus baseline."""

    cycles: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    reap_s: dict[str, list[float]] = field(default_factory=dict)  #: seconds from leaving to closed, by kind
    late: list[str] = field(default_factory=list)  #: sessions closed after their bound
    leaks: dict[str, int] = field(default_factory=dict)
    threads: dict[str, list[str]] = field(default_factory=dict)  #: thread names at the baseline and after
    fd_targets: dict[str, list[str]] = field(default_factory=dict)  #: what the descriptors point at, before/after
    task_errors: list[str] = field(default_factory=list)  #: asyncio ERROR records (e.g. unretrieved exceptions)
    baseline: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["reap_s"] = {k: {"n": len(v), "max": round(max(v), 3), "bound": BOUND_S[k]} for k, v in self.reap_s.items()}
        return d

    @property
    def ok(self) -> bool:
        return not self.late and not any(self.leaks.values()) and not self.task_errors


def _fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return sorted(out)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _thread_names() -> list[str]:
    """Threads other than pooled workers (asyncio's default executor, AnyIO's: reused, bounded in number)."""
    pooled = ("asyncio_", "ThreadPoolExecutor", "AnyIO worker")
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith(pooled))


def _threads() -> int:
    return len(_thread_names())


def _open_pcs() -> int:
    from aiortc import RTCPeerConnection

    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, RTCPeerConnection) and o.connectionState != "closed")


def _server_tasks(srv: Any) -> int:
    async def count() -> int:
        return len(asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(count(), srv.manager.loop).result(10)


def snapshot(srv: Any) -> dict[str, int]:
    return {"fds": _fds(), "threads": _threads(), "server_tasks": _server_tasks(srv), "peers": len(srv.app.state.peers),
            "peer_connections": _open_pcs(), "sessions": len(srv.manager.sessions)}


async def _offering_pc() -> Any:
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("actions")
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc


async def one_cycle(kind: str, url: str, http: httpx.AsyncClient, rng: random.Random) -> tuple[str, str, float]:
    """Run one cycle; returns (session id, outcome, time the client left, monotonic s)."""
    from worldcast.transport.clients.webrtc import WebRTCClient

    if kind in ("clean", "no_delete"):
        c = await WebRTCClient.connect(url, seed=rng.randrange(1000))
        await c.next_frame()
        await c.aclose(delete=kind == "clean")
        return c.session_id, "ok", time.monotonic()
    if kind == "killed":
        proc = subprocess.Popen([sys.executable, "-m", "tests.cycles", "--client", url], stdout=subprocess.PIPE,
                                text=True, env=os.environ.copy())
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)  # type: ignore[union-attr]
            if not line.startswith("ready "):
                raise RuntimeError(f"client process said {line!r}")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()  # type: ignore[union-attr]
        return line.split()[1], "ok", time.monotonic()
    r = await http.post("/v1/sessions", json={})
    r.raise_for_status()
    sid, h = r.json()["session_id"], {"Authorization": f"Bearer {r.json()['token']}"}
    pc = await _offering_pc()
    body = {"sdp": pc.localDescription.sdp, "type": "offer"}
    if kind == "never_connected":
        a = await http.post(f"/v1/sessions/{sid}/webrtc", json=body, headers=h)
        await pc.close()
        return sid, str(a.status_code), time.monotonic()
    post = asyncio.create_task(http.post(f"/v1/sessions/{sid}/webrtc", json=body, headers=h))
    await asyncio.sleep(rng.uniform(0.0, 0.012))
    await http.delete(f"/v1/sessions/{sid}", headers=h)
    left = time.monotonic()
    a = await post
    await pc.close()
    return sid, str(a.status_code), left


async def _reaped(srv: Any, sid: str, timeout_s: float) -> float | None:
    """Monotonic time the session was first seen closed (None: not within timeout_s)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if sid not in srv.manager.sessions:
            return time.monotonic()
        await asyncio.sleep(0.05)
    return None


async def run_cycles(srv: Any, cycles: int, *, seed: int = 0) -> CycleReport:
    """Warm up (one cycle of each kind), then `cycles` cycles; audit reaping and leaks."""
    from worldcast.transport.webrtc.peer import quiet_closed_transport_errors

    rep, rng, t0 = CycleReport(), random.Random(seed), time.monotonic()
    quiet_closed_transport_errors(asyncio.get_running_loop())  # the clients' side, as the server does
    errors = _AsyncioErrors()
    logging.getLogger("asyncio").addHandler(errors)
    try:
        await _cycles(rep, srv, cycles, rng)
    finally:
        logging.getLogger("asyncio").removeHandler(errors)
    gc.collect()
    rep.task_errors = errors.records[:20]
    rep.seconds = time.monotonic() - t0
    return rep


class _AsyncioErrors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage()[:300])


async def _cycles(rep: CycleReport, srv: Any, cycles: int, rng: random.Random) -> None:
    # the HTTP clients are closed before each snapshot, so their pooled keep-alive sockets are not counted
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
        for kind in KINDS:
            await one_cycle(kind, srv.url, http, rng)
    rep.baseline = await _settle(srv)
    rep.threads["baseline"] = _thread_names()
    rep.fd_targets["baseline"] = _fd_targets()
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
        watchers: list[asyncio.Task[None]] = []
        for i in range(cycles):
            kind = KINDS[i % len(KINDS)]
            sid, status, left = await one_cycle(kind, srv.url, http, rng)
            rep.cycles += 1
            rep.kinds[kind] += 1
            rep.statuses[f"{kind}:{status}"] += 1
            watchers.append(asyncio.create_task(_watch(rep, srv, kind, sid, left)))
        await asyncio.gather(*watchers)
    after = await _settle(srv)
    for k, v in after.items():
        if k in ("sessions", "peers", "peer_connections"):
            rep.leaks[k] = v
        else:
            rep.leaks[k] = max(0, v - rep.baseline[k])
    rep.threads = {"baseline": rep.threads.get("baseline", []), "after": _thread_names()}
    rep.fd_targets["after"] = _fd_targets()


async def _watch(rep: CycleReport, srv: Any, kind: str, sid: str, left: float) -> None:
    at = await _reaped(srv, sid, BOUND_S[kind] + SLACK_S + 30.0)
    took = (at - left) if at is not None else float("inf")
    rep.reap_s.setdefault(kind, []).append(took)
    if took > BOUND_S[kind] + SLACK_S:
        rep.late.append(f"{kind} {sid}: closed after {took:.2f} s (bound {BOUND_S[kind]:.1f} s + {SLACK_S:g} s)")


async def _settle(srv: Any, timeout_s: float = 30.0) -> dict[str, int]:
    """Wait (bounded) until no session or peer is left and the counts stop falling; returns the snapshot."""
    end = time.monotonic() + timeout_s
    snap = snapshot(srv)
    while time.monotonic() < end:
        await asyncio.sleep(0.3)
        new = snapshot(srv)
        if new == snap and not new["sessions"] and not new["peers"] and not new["peer_connections"]:
            return new
        snap = new
    return snap


def serve_and_run(cycles: int, seed: int = 0) -> CycleReport:
    """Start the in-process server (`cycle_config`) and run the cycles against it."""
    import torch

    from tests.conftest import _serve
    from worldcast.models.tinyworld import TinyWorldModel

    torch.set_num_threads(1)
    gen = _serve(cycle_config(), TinyWorldModel.from_pretrained())
    srv = next(gen)
    try:
        return asyncio.run(run_cycles(srv, cycles, seed=seed))
    finally:
        gen.close()


async def _client(url: str) -> None:
    """The `killed` kind's client process: connect, get a frame, say so, then wait to be killed."""
    from worldcast.transport.clients.webrtc import WebRTCClient
    from worldcast.transport.webrtc.peer import configure_ice

    configure_ice(["127.0.0.1"])
    c = await WebRTCClient.connect(url, seed=7)
    await c.next_frame()
    print("ready", c.session_id, flush=True)
    await asyncio.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cycles", description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.client:
        asyncio.run(_client(a.client))
        return 0
    rep = serve_and_run(a.cycles, a.seed)
    text = json.dumps(rep.as_dict(), indent=2)
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
