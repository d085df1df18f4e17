"""Issue 31, item 4: churn never kills a session. Several clients create, read and delete sessions as fast as
they can against a `worldcast serve` process (engines in the server's process and in their own, TinyWorld and
Matrix-Game 2.0 tiny), right after /readyz turns ready, while one session created first stays open: no session
the test did not delete may ever close.

The race this guards: the server counts a state slot free the moment it removes a session, while the engine
frees it only when its device loop comes round; an add that arrived in between was refused by the engine ("all
4 state slots in use") after the create had answered 201, and the new session closed in error ms later (32 of 60
cycles on matrix-game-2:tiny with an engine process before the fix, `DeviceWorker._free_slots_locked`)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.transport.test_engines_failover import serve

pytestmark = pytest.mark.timeout(600)

CLIENTS = 3
CYCLES = 20  #: per client: create, two reads, delete


async def churn(http: httpx.AsyncClient, problems: list[str]) -> int:
    done = 0
    for _ in range(CYCLES):
        r = await http.post("/v1/sessions", json={})
        if r.status_code != 201:  # a refusal is allowed (capacity), a death after 201 is not
            assert r.status_code == 503, r.text
            await asyncio.sleep(0.05)
            continue
        j: dict[str, Any] = r.json()
        h = {"Authorization": f"Bearer {j['token']}"}
        for _ in range(2):
            g = await http.get(f"/v1/sessions/{j['session_id']}", headers=h)
            if g.status_code != 200 or g.json().get("state") == "closed":
                problems.append(f"{j['session_id']} closed before its delete: {g.status_code} {g.text[:200]}")
        d = await http.delete(f"/v1/sessions/{j['session_id']}", headers=h)
        if d.status_code not in (200, 204):
            problems.append(f"{j['session_id']}: delete answered {d.status_code} {d.text[:200]}")
        done += 1
    return done


@pytest.mark.parametrize("model", ["tinyworld", "matrix-game-2:tiny"])
@pytest.mark.parametrize("kind", ["--engine-process", "--no-engine-process"])
async def test_churn_closes_no_session_it_did_not_delete(model: str, kind: str) -> None:
    with serve("--model", model, kind, "--admission", "static", "--max-sessions", "4", up=1) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            r = await http.post("/v1/sessions", json={})
            assert r.status_code == 201, r.text
            keeper = r.json()
            kh = {"Authorization": f"Bearer {keeper['token']}"}
            problems: list[str] = []
            done = await asyncio.gather(*(churn(http, problems) for _ in range(CLIENTS)))
            assert not problems, f"{len(problems)} problems in {sum(done)} cycles: {problems[:5]}"
            assert sum(done) >= CLIENTS * CYCLES // 2, f"only {sum(done)} cycles were admitted"
            g = await http.get(f"/v1/sessions/{keeper['session_id']}", headers=kh)
            assert g.status_code == 200 and g.json()["state"] != "closed", g.text
