"""No route names another caller's session or any pid (issue 31, item 3): every route of the app, read from
FastAPI's route table (so a route added later is walked too), is called anonymously and with one session's
token, on that session's id and on another's, against a real server on loopback. A response may name the
caller's own sessions (the one it holds, any it created during the walk); never the other session, never an
engine's or the server's pid. The admin token's view of `/v1/engines` does name both: the control that shows
the scan can fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import Mount, Route
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import LiveServer, _serve, server_config
from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.sessions.manager import SessionConfig

pytestmark = pytest.mark.timeout(300)

ADMIN = "walk-admin-token-0123456789"
#: A WebSocket route gets this long to say something before the walk moves on (seconds; a loaded machine).
WS_READ_S = 3.0
#: Bodies that reach past validation where a route takes one (any other route gets `{}`).
BODIES: dict[str, Any] = {
    "/v1/sessions/{session_id}/rpc": {"jsonrpc": "2.0", "id": 1, "method": "get_state"},
    "/v1/sessions/{session_id}/webrtc": {"sdp": "v=0\r\n", "type": "offer"},
}
_PID_TEXT = re.compile(r"pid\W{0,4}(\d+)", re.IGNORECASE)


@pytest.fixture(scope="module")
def server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    cfg = server_config(admin_token=ADMIN, sessions=SessionConfig(
        idle_after_s=60.0, timeout_s=120.0, admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=8)))
    yield from _serve(cfg, model)


def _pids(server: LiveServer) -> set[int]:
    return {os.getpid()} | {e.pid for e in server.manager.engines if e.pid is not None}


def _json_leaks(value: Any, pids: set[int], foreign: set[str], where: str = "") -> list[str]:
    """The places in a decoded JSON value that name a foreign session id or a pid (by key or by value)."""
    out: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if "pid" in str(k).lower():
                out.append(f"{where}.{k} (a pid field)")
            if str(k) in foreign:
                out.append(f"{where} key {k}")
            out += _json_leaks(v, pids, foreign, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _json_leaks(v, pids, foreign, f"{where}[{i}]")
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int) and value in pids:
        out.append(f"{where} = {value} (a pid)")
    elif isinstance(value, str):
        out += [f"{where} names {s}" for s in foreign if s in value]
    return out


def leaks(body: str | bytes, pids: set[int], foreign: set[str]) -> list[str]:
    """Foreign session ids and pids in one response body (JSON by structure, anything else as text)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        return _json_leaks(json.loads(text), pids, foreign)
    except ValueError:
        found = [f"names {s}" for s in foreign if s in text]
        found += [f"text {m.group(0)!r}" for m in _PID_TEXT.finditer(text) if int(m.group(1)) in pids]
        return found


def _flatten(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(prefix, route) of every route, through included routers (FastAPI 0.165 keeps an included router as
    one `_IncludedRouter` entry of the table, with the router and its prefix; older versions copied its
    routes in)."""
    for r in routes:
        sub = getattr(r, "original_router", None)
        if sub is not None:
            yield from _flatten(sub.routes, prefix + (getattr(getattr(r, "include_context", None), "prefix", "") or ""))
        else:
            yield prefix, r


def walk(app: Any) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app, WebSocket routes as method "WS"; deletes last (a
    delete closes the caller's session, which later calls still need).

    Raises:
        AssertionError: a kind of route the walk does not know (teach it rather than skip it).
    """
    out: list[tuple[str, str]] = []
    for prefix, r in _flatten(app.routes):
        if isinstance(r, APIWebSocketRoute):
            out.append(("WS", prefix + r.path))
        elif isinstance(r, APIRoute | Route):
            out += [(m, prefix + r.path) for m in sorted(r.methods or {"GET"}) if m != "HEAD"]
        elif isinstance(r, Mount):
            out.append(("GET", prefix + (r.path or "/")))
        else:
            raise AssertionError(f"the walk does not know route {r!r}")
    return sorted(out, key=lambda mp: mp[0] == "DELETE")


def fill(path: str, session_id: str) -> str:
    # a viewer's, a WHEP resource's and a snapshot's id: unknown ones (the walk holds none); their routes answer 404
    params = {"session_id": session_id, "engine_id": "0", "viewer_id": "v0123456789ab",
              "resource_id": "0123456789abcdef01234567", "snapshot_id": "0123456789abcdef"}
    for name in re.findall(r"{(\w+)(?::\w+)?}", path):
        assert name in params, f"the walk does not know path parameter {name!r} of {path}: teach it"
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: params[m.group(1)], path)


async def ws_messages(url: str, headers: dict[str, str]) -> list[str]:
    """What a WebSocket route says within `WS_READ_S` of opening (or its refusal's body)."""
    got: list[str] = []
    try:
        async with connect(url, additional_headers=headers, compression=None, open_timeout=10) as ws:
            try:
                while True:
                    m = await asyncio.wait_for(ws.recv(), WS_READ_S)
                    got.append(m if isinstance(m, str) else m.decode("utf-8", "replace"))
            except (TimeoutError, ConnectionClosed):
                pass
    except InvalidStatus as e:
        got.append(e.response.body.decode("utf-8", "replace") if e.response.body else "")
    return got


async def test_no_route_names_another_session_or_a_pid(server: LiveServer) -> None:
    base_ws = "ws" + server.url.removeprefix("http")
    routes = walk(server.app)
    assert ("GET", "/v1/engines") in routes and ("WS", "/v1/sessions/{session_id}/stream") in routes, routes
    assert len(routes) >= 20, routes  # every surface of the module docstring of `transport/http/app.py`
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        async def create() -> tuple[str, str]:
            r = await http.post("/v1/sessions", json={})
            assert r.status_code == 201, r.text
            return r.json()["session_id"], r.json()["token"]

        victim, _victim_token = await create()
        mine, token = await create()
        own = {mine}
        pids = _pids(server)
        # the control: the operator's view names the victim and the pid, so the scan below can see them
        admin_view = (await http.get("/v1/engines", headers={"Authorization": f"Bearer {ADMIN}"})).text
        assert leaks(admin_view, pids, {victim}), admin_view
        found: list[str] = []
        for method, path in routes:
            for sid in (mine, victim):
                for headers in ({}, {"Authorization": f"Bearer {token}"}):
                    url = fill(path, sid)
                    who = f"{method} {url} {'with the token' if headers else 'anonymously'}"
                    if method == "WS":
                        said = await ws_messages(base_ws + url, headers)
                        body = "\n".join(said)
                    else:
                        r = await http.request(method, url, headers=headers,
                                               json=BODIES.get(path, {}) if method in ("POST", "PUT", "PATCH") else None)
                        body = r.text
                        if method == "POST" and path == "/v1/sessions" and r.status_code == 201:
                            own.add(r.json()["session_id"])  # the caller's own from now on
                    foreign = {s for s in server.manager.sessions if s not in own} | {victim}
                    found += [f"{who}: {x}" for x in leaks(body, pids, foreign)]
                    if method == "DELETE" and sid == mine and headers:
                        mine, token = await create()  # a fresh session of the caller's for what follows
                        own.add(mine)
        assert not found, "\n".join(found)
        # the anonymous view is exactly what /readyz says: each engine's id and state, how many are up
        ready = (await http.get("/readyz")).json()["engines"]
        anon = (await http.get("/v1/engines")).json()
        assert anon == {"engines": [{"id": int(i), "state": s} for i, s in ready["states"].items()],
                        "up": ready["up"], "total": ready["total"]}
        assert (await http.get("/v1/engines/0")).json() == {"id": 0, "state": ready["states"]["0"]}
        assert (await http.get("/v1/engines/7")).status_code == 404
        # a header that is not the admin token is refused precisely, not read as anonymous
        r = await http.get("/v1/engines", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 403 and r.json()["detail"] == "not the admin token", r.text
        r = await http.get("/v1/engines/0", headers={"Authorization": "Basic eA=="})
        assert r.status_code == 401, r.text
        full = (await http.get("/v1/engines/0", headers={"Authorization": f"Bearer {ADMIN}"})).json()
        assert full["pid"] == os.getpid() and mine in full["sessions"]
