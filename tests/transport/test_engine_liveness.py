"""Issue 31, item 1: a hung engine is found and routed around. `worldcast serve --engines 2` in its own
process; one engine process is stopped with SIGSTOP (what a wedged kernel, a deadlock or a swapping host looks
like from outside) and continued with SIGCONT: it is marked `stalled`, its user is told, new sessions go to the
other engine, a drain answers, it comes back on SIGCONT, and past the kill bound it is killed and restarted. A
server with a single engine answers /readyz 503 while it is stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx
import pytest

from tests.transport.test_engines_failover import ADMIN, READY_TIMEOUT_S, engines, media, serve, until
from worldcast.transport.clients.stream import StreamClient

pytestmark = pytest.mark.timeout(900)

STALL_AFTER_S = 1.0
KILL_AFTER_S = 15.0


def stall_flags() -> tuple[str, ...]:
    return ("--stall-after", str(STALL_AFTER_S), "--stall-kill-after", str(KILL_AFTER_S))


async def wait_state(http: httpx.AsyncClient, engine_id: int, state: str, timeout_s: float) -> dict[str, Any]:
    end = time.monotonic() + timeout_s
    while True:
        e = (await engines(http))[engine_id]
        if e["state"] == state:
            return e
        assert time.monotonic() < end, f"engine {engine_id} not {state} within {timeout_s} s: {e}"
        await asyncio.sleep(0.05)


def errors(c: StreamClient, code: str) -> list[dict[str, Any]]:
    return [e for e in list(c.events) if e.get("event") == "error" and e.get("code") == code]


async def test_a_stopped_engine_is_stalled_routed_around_recovers_and_is_killed_past_the_bound() -> None:
    with serve("--engines", "2", "--admission", "static", "--max-sessions", "4", "--admin-token", ADMIN,
               "--precision", "float32",
               "--restart-backoff", "0.5", *stall_flags()) as server:
        async with httpx.AsyncClient(base_url=server, timeout=30) as http:
            # one session on each engine: both ready first (/readyz answers once one is; on a starved 2-core
            # box an engine still warming can miss a heartbeat and be skipped by placement for a moment)
            for e in (0, 1):
                await wait_state(http, e, "ready", READY_TIMEOUT_S)
            a = await StreamClient.connect(server, decode=False, seed=1)
            for e in (0, 1):
                await wait_state(http, e, "ready", READY_TIMEOUT_S)
            b = await StreamClient.connect(server, decode=False, seed=2)
            c: StreamClient | None = None
            victim_pid: int | None = None
            try:
                info = {x: (await http.get(f"/v1/sessions/{x.session_id}",
                                           headers={"Authorization": f"Bearer {x.token}"})).json() for x in (a, b)}
                if info[a]["engine"] == info[b]["engine"]:  # placement takes the most measured headroom: it may
                    # put both on one engine; the test needs one on each
                    other = 1 - info[a]["engine"]
                    r = await http.post(f"/v1/sessions/{b.session_id}/move", json={"engine": other},
                                        headers={"Authorization": f"Bearer {ADMIN}"})
                    assert r.status_code == 200, r.text
                    info[b]["engine"] = other
                assert {info[a]["engine"], info[b]["engine"]} == {0, 1}
                victim, healthy = info[b]["engine"], info[a]["engine"]
                await until(lambda: len(media(a)) >= 10 and len(media(b)) >= 10, 60, "both streaming")
                victim_pid = (await engines(http))[victim]["pid"]

                # SIGSTOP: stalled, the user told, placement and drain route around it
                t_stop = time.monotonic()
                os.kill(victim_pid, signal.SIGSTOP)
                ev = await b.wait_event(lambda e: e.get("event") == "error", timeout_s=10, past=True)
                t_told = ev["received_s"] - t_stop
                assert ev["code"] == "engine_stalled" and f"engine {victim}" in ev["message"], ev
                # the bar is 2 s (stall bound 1 s here + detection); generous on a loaded 2-core machine
                assert t_told < 4.0, f"engine_stalled arrived {t_told:.2f} s after SIGSTOP"
                st = await wait_state(http, victim, "stalled", 5)
                assert st["load"]["no_progress_s"] >= STALL_AFTER_S and st["load"]["stalls"] == 1, st
                assert (await engines(http))[healthy]["state"] == "ready"
                metrics = (await http.get("/metrics")).text
                assert f'worldcast_engine_state{{device="cpu",engine="{victim}",state="stalled"}} 1.0' in metrics \
                    or f'engine="{victim}",state="stalled"' in metrics, metrics[:2000]
                assert "worldcast_engines_up 1.0" in metrics
                r = await http.get("/readyz")
                assert r.status_code == 200  # the other engine can take sessions
                c = await StreamClient.connect(server, decode=False, seed=3)
                ci = (await http.get(f"/v1/sessions/{c.session_id}",
                                     headers={"Authorization": f"Bearer {c.token}"})).json()
                assert ci["engine"] == healthy, "a new session goes to the engine that makes progress"
                await until(lambda: len(media(c)) >= 5, 60, "the new session streams on the healthy engine")
                t0 = time.monotonic()
                r = await http.post(f"/v1/engines/{victim}/drain", headers={"Authorization": f"Bearer {ADMIN}"},
                                    timeout=30)
                t_drain = time.monotonic() - t0
                assert r.status_code == 200 and t_drain < 5.0, (r.status_code, t_drain)
                assert "stalled" in r.json()["stayed"][b.session_id], r.json()
                await http.post(f"/v1/engines/{victim}/undrain", headers={"Authorization": f"Bearer {ADMIN}"})
                assert not errors(b, "engine_lost") and b.closed_code is None

                # SIGCONT before the kill bound: ready again, the same process, the session streams on
                assert time.monotonic() - t_stop < KILL_AFTER_S - 3, "the checks above took too long to test SIGCONT"
                os.kill(victim_pid, signal.SIGCONT)
                back = await wait_state(http, victim, "ready", 10)
                assert back["pid"] == victim_pid and back["restarts"] == 0 and b.session_id in back["sessions"]
                t_cont = time.monotonic()
                await until(lambda: len(media(b, t_cont)) >= 5, 30, "the stopped engine's session streams again")
                assert not errors(b, "engine_lost")

                # SIGSTOP past the kill bound: killed, its session lost, the engine restarted
                t_stop = time.monotonic()
                os.kill(victim_pid, signal.SIGSTOP)
                lost = await b.wait_event(lambda e: e.get("event") == "error" and e.get("code") == "engine_lost",
                                          timeout_s=KILL_AFTER_S + 30)
                t_lost = lost["received_s"] - t_stop
                assert KILL_AFTER_S <= t_lost + 0.5, f"killed after {t_lost:.1f} s, before the {KILL_AFTER_S} s bound"
                assert "no progress" in lost["message"], lost
                now = await wait_state(http, victim, "ready", READY_TIMEOUT_S)
                assert now["pid"] != victim_pid and now["restarts"] == 1 and now["losses"] == 1, now
                victim_pid = None
                assert len(errors(b, "engine_stalled")) == 2
                assert not errors(a, "engine_stalled") and not errors(a, "engine_lost")
            finally:
                if victim_pid is not None:
                    os.kill(victim_pid, signal.SIGCONT)
                for x in (a, c):
                    if x is not None:
                        await x.aclose()
                await b.aclose(delete=False)


async def test_readyz_fails_while_the_only_engine_is_stopped() -> None:
    with serve("--engines", "1", "--engine-process", "--admin-token", ADMIN, *stall_flags(), up=1) as server:
        async with httpx.AsyncClient(base_url=server, timeout=30) as http:
            pid = (await engines(http))[0]["pid"]
            assert (await http.get("/readyz")).status_code == 200
            os.kill(pid, signal.SIGSTOP)
            try:
                await wait_state(http, 0, "stalled", 10)
                r = await http.get("/readyz")
                assert r.status_code == 503 and "stalled" in r.json()["reason"], r.text
                r = await http.post("/v1/sessions", json={})
                assert r.status_code in (503, 429), r.text  # no engine can take it
            finally:
                os.kill(pid, signal.SIGCONT)
            await wait_state(http, 0, "ready", 10)
            assert (await http.get("/readyz")).status_code == 200
