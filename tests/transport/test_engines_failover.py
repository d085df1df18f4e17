"""Issue 21's Done-when, checked from outside: `worldcast serve --engines 2 --admission static --max-sessions 4`
in its own process, two streaming sessions on different engines, SIGKILL of one engine's pid (from GET
/v1/engines): the other session keeps streaming, the victim's stream gets `engine_lost`, the engine comes
back ready and a new session streams; then the operator routes (drain, move) on the same server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from worldcast.transport.clients.stream import StreamClient

pytestmark = pytest.mark.timeout(900)

ADMIN = "test-admin-token-0123456789"
#: a server with two engine processes warms both up: slow on a busy 2-core machine
READY_TIMEOUT_S = 240.0


#: base URL -> the log file of the server process serving it (printed under a test that fails)
SERVER_LOGS: dict[str, str] = {}


@contextlib.contextmanager
def serve(*flags: str, up: int = 2) -> Iterator[str]:
    """A `worldcast serve` process with `flags`, once `up` engines are ready; yields its base URL."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="worldcast-engines-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [sys.executable, "-m", "worldcast.transport.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--ice-host", "127.0.0.1", "--log-level", "warning", "--video-scale", "1", *flags]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"server exited ({proc.returncode}): {open(log.name).read()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready in {READY_TIMEOUT_S} s: {open(log.name).read()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=5).json().get("engines", {}).get("up") == up:
                    break
            time.sleep(0.3)
        SERVER_LOGS[url] = log.name
        yield url
    finally:
        SERVER_LOGS.pop(url, None)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # one dtype for both engines: each measures its own at warm-up, and two that choose different dtypes of one
    # size (bfloat16, float16) cannot take each other's sessions (a move refuses: "declared state differs")
    with serve("--engines", "2", "--admission", "static", "--max-sessions", "4", "--admin-token", ADMIN,
               "--restart-backoff", "0.5", "--precision", "float32") as url:
        yield url


@pytest.fixture(autouse=True)
def server_log_on_failure(request: pytest.FixtureRequest, server: str) -> Iterator[None]:
    """Print the tail of the server's log under a test that failed (the log file goes with the server)."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and server in SERVER_LOGS:
        with open(SERVER_LOGS[server]) as f:
            print(f"--- the server's log (last 8000 characters) ---\n{f.read()[-8000:]}")


def media(c: StreamClient, since_s: float = 0.0) -> list[dict[str, Any]]:
    return [e for e in list(c.events) if e.get("event") == "media" and e["received_s"] >= since_s]


async def until(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.02)


async def both_engines_up(http: httpx.AsyncClient) -> None:
    """Wait until /readyz counts both engines up (one may be stalled for a moment by a busy machine at start);
    readiness has no event to wait on from outside, so it is polled, bounded by `READY_TIMEOUT_S`."""
    end = time.monotonic() + READY_TIMEOUT_S
    while (await http.get("/readyz")).json()["engines"]["up"] < 2:
        assert time.monotonic() < end, f"both engines up: not within {READY_TIMEOUT_S} s"
        await asyncio.sleep(0.2)


async def engines(http: httpx.AsyncClient) -> dict[int, dict[str, Any]]:
    """The operator's view of the engines (pids and session ids need the admin token)."""
    r = await http.get("/v1/engines", headers={"Authorization": f"Bearer {ADMIN}"})
    return {e["id"]: e for e in r.json()["engines"]}


async def test_each_engine_process_reports_its_resident_memory(server: str) -> None:
    """`worldcast_engine_process_resident_memory_bytes`: one sample per engine process, read from its /proc entry
    (the `rss` and `soak` benchmarks add them to the server's own)."""
    from worldcast.latency_bench.server import ENGINE_RSS
    from worldcast.transport.http.metrics import process_rss_bytes

    async with httpx.AsyncClient(base_url=server, timeout=30) as http:
        text = (await http.get("/metrics")).text
        pids = {e["id"]: e["pid"] for e in (await engines(http)).values()}
    rss = {line.split('engine="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
           for line in text.splitlines() if line.startswith(ENGINE_RSS + "{")}
    assert set(rss) == {"0", "1"} and all(v > 50 * 2**20 for v in rss.values()), rss  # torch and a model each
    assert all(pid != os.getpid() and process_rss_bytes(pid) is not None for pid in pids.values())
    assert process_rss_bytes(2**22 + 12345) is None  # no such process


async def test_a_killed_engine_takes_only_its_sessions_and_comes_back(server: str) -> None:
    async with httpx.AsyncClient(base_url=server, timeout=30) as http:
        await both_engines_up(http)
        a = await StreamClient.connect(server, decode=False, seed=1)
        b = await StreamClient.connect(server, decode=False, seed=2)
        try:
            async def placed() -> dict[StreamClient, dict[str, Any]]:
                return {c: (await http.get(f"/v1/sessions/{c.session_id}",
                                           headers={"Authorization": f"Bearer {c.token}"})).json() for c in (a, b)}

            info = await placed()
            if info[a]["engine"] == info[b]["engine"]:
                # placement takes the engine with the most measured headroom, which may hold `a` already when
                # the two engines measured different step costs: put `b` on the other engine by hand
                r = await http.post(f"/v1/sessions/{b.session_id}/move", json={"engine": 1 - info[a]["engine"]},
                                    headers={"Authorization": f"Bearer {ADMIN}"})
                assert r.status_code == 200, r.text
                info = await placed()
            assert {info[a]["engine"], info[b]["engine"]} == {0, 1}, "the two sessions are on two engines"
            await until(lambda: len(media(a)) >= 20 and len(media(b)) >= 20, 60, "both streaming")
            before = await engines(http)
            victim_engine = info[b]["engine"]
            victim_pid = before[victim_engine]["pid"]
            assert before[victim_engine]["state"] == "ready" and b.session_id in before[victim_engine]["sessions"]
            assert victim_pid not in (None, os.getpid())
            t_pre = time.monotonic()
            await asyncio.sleep(4.0)
            rate_before = len(media(a, t_pre)) / 4.0  # the survivor's own rate on this machine, frames/s

            t_kill = time.monotonic()
            os.kill(victim_pid, signal.SIGKILL)
            lost = await b.wait_event(lambda e: e.get("event") == "error", timeout_s=10, past=True)
            t_lost = lost["received_s"] - t_kill
            assert lost["code"] == "engine_lost" and f"engine {victim_engine}" in lost["message"], lost
            assert t_lost < 2.0, f"engine_lost arrived {t_lost:.2f} s after the kill"
            await until(lambda: b.closed_code is not None or b.ws.close_code is not None, 10, "victim stream closed")

            await asyncio.sleep(max(0.0, t_kill + 4.0 - time.monotonic()))
            after = len(media(a, t_kill))
            # The bar (>= 60 frames in the 4 s after the kill, 75 % of a 20 fps stream) is a speed: the
            # engines bench measures it (BENCHMARKS, "Kill and move"). This test checks the behaviour under any
            # load: the survivor keeps streaming through the kill, no gap longer than a second and a half and
            # at least a third of its own earlier rate, while the restarting engine imports torch on the same cores.
            got = media(a, t_kill - 1.0)
            gaps = [y["received_s"] - x["received_s"] for x, y in zip(got, got[1:], strict=False)]
            assert after >= max(4, int(rate_before * 4.0 / 3)), \
                f"survivor: {after} frames in the 4 s after the kill (before: {rate_before:.1f}/s)"
            assert max(gaps) < 1.5, f"survivor stalled {max(gaps):.2f} s around the kill"
            r = await http.get(f"/v1/sessions/{b.session_id}", headers={"Authorization": f"Bearer {b.token}"})
            assert r.status_code == 404  # closed cleanly, freed

            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                now = (await engines(http))[victim_engine]
                if now["state"] == "ready":
                    break
                assert time.monotonic() < deadline, f"engine {victim_engine} not back: {now}"
                await asyncio.sleep(0.2)
            t_ready = time.monotonic() - t_kill
            assert now["pid"] != victim_pid and now["restarts"] == 1 and now["losses"] == 1 and now["sessions"] == []
            c = await StreamClient.connect(server, decode=False, seed=3)
            try:
                ci = (await http.get(f"/v1/sessions/{c.session_id}",
                                     headers={"Authorization": f"Bearer {c.token}"})).json()
                if ci["engine"] != victim_engine:  # (the survivor measured more headroom: placement's choice)
                    r = await http.post(f"/v1/sessions/{c.session_id}/move", json={"engine": victim_engine},
                                        headers={"Authorization": f"Bearer {ADMIN}"})
                    assert r.status_code == 200, r.text
                    ci = (await http.get(f"/v1/sessions/{c.session_id}",
                                         headers={"Authorization": f"Bearer {c.token}"})).json()
                assert ci["engine"] == victim_engine  # the restarted engine takes a session
                await until(lambda: len(media(c)) >= 10, 60, "a new session on the restarted engine streams")
            finally:
                await c.aclose()
            metrics = (await http.get("/metrics")).text
            assert "worldcast_engines_lost_total 1.0" in metrics and "worldcast_engines_up 2.0" in metrics
            print(f"kill -> engine_lost {t_lost * 1e3:.0f} ms, -> ready {t_ready:.2f} s, survivor {after} frames "
                  f"in 4 s (before {rate_before:.1f}/s), load {os.getloadavg()}")
        finally:
            await a.aclose()
            await b.aclose(delete=False)


async def test_drain_moves_a_streaming_session_and_operator_routes_need_the_token(server: str) -> None:
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        await both_engines_up(http)
        a = await StreamClient.connect(server, decode=False, seed=4)
        try:
            auth = {"Authorization": f"Bearer {a.token}"}
            src = (await http.get(f"/v1/sessions/{a.session_id}", headers=auth)).json()["engine"]
            assert (await http.post(f"/v1/engines/{src}/drain")).status_code == 401
            bad = await http.post(f"/v1/engines/{src}/drain", headers={"Authorization": "Bearer " + "x" * 30})
            assert bad.status_code == 403
            assert (await http.post("/v1/engines/9/drain", headers={"Authorization": f"Bearer {ADMIN}"})).status_code \
                == 404
            await until(lambda: len(media(a)) >= 10, 60, "streaming")
            r = await http.post(f"/v1/engines/{src}/drain", headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["engine"]["draining"] is True and body["stayed"] == {}
            (moved,) = body["moved"]
            assert moved["session_id"] == a.session_id and moved["from"] == src and moved["to"] == 1 - src
            assert (await http.get(f"/v1/sessions/{a.session_id}", headers=auth)).json()["engine"] == 1 - src
            n = len(media(a))
            await until(lambda: len(media(a)) >= n + 10, 60, "the moved session streams on")
            pts = [e["pts"] for e in media(a)]
            assert all(q > p for p, q in zip(pts, pts[1:])), "PTS never go back across the move"
            back = await http.post(f"/v1/sessions/{a.session_id}/move", json={"engine": src, "verify": True},
                                   headers={"Authorization": f"Bearer {ADMIN}"})
            assert back.status_code == 409 and "draining" in back.text, back.text
            undrain = await http.post(f"/v1/engines/{src}/undrain", headers={"Authorization": f"Bearer {ADMIN}"})
            assert undrain.status_code == 200 and undrain.json()["draining"] is False
            r = await http.post(f"/v1/sessions/{a.session_id}/move", json={"engine": src, "verify": True},
                                headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 200 and r.json()["identical"] is True and r.json()["to"] == src, r.text
        finally:
            await a.aclose()
