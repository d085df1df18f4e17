"""Hardening II (issue 22): each failure of the hostile run, as a kind, against a real server on loopback.

Capacity is held only by viewers or a named grace; failed creates free everything; a caller without a
token learns nothing about ids; every message kind on every stream counts toward one flood verdict and is
answered by summaries; one prompt rule; JSON-only bodies; request heads in bounded time; the client's seq
and `rpc()`. Timeouts are short here (stated below) so the bounds are checked in seconds; every wait is on
a condition, bounded. (LiveKit's live cases, which need livekit-server, are in tests/transport/livekit/.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import LiveServer, _serve, free_port, server_config
from tests.transport.test_hardening import info, new_session, offering_pc, until
from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.sessions.manager import SessionConfig
from worldcast.transport.http.conn_limits import ConnectionLimits
from worldcast.transport.http.metrics import MetricsConfig
from worldcast.transport.limits import InputLimits

pytestmark = pytest.mark.timeout(240)

GRACE_S = 2.0  #: connect grace: a session without a viewer this long after creation is closed
NEGOTIATION_TIMEOUT_S = 2.0  #: an answered peer not connected after this is closed
TICK_S = 0.2  #: housekeeping period
HEAD_TIMEOUT_S = 1.0  #: a request head must arrive within this
MAX_PER_CLIENT = 24  #: open connections per address
SLACK_S = 6.0  #: on every bound (a shared 2-core machine); the bounds are the timeouts above


def ws_base(url: str) -> str:
    return "ws" + url.removeprefix("http")


@pytest.fixture(scope="module")
def server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    cfg = server_config(
        video_scale=None,  # README's flags
        negotiation_timeout_s=NEGOTIATION_TIMEOUT_S,
        input_limits=InputLimits(abuse_rejections_per_s=50, abuse_sustained_s=2.0),
        connections=ConnectionLimits(head_timeout_s=HEAD_TIMEOUT_S, max_per_client=MAX_PER_CLIENT),
        metrics=MetricsConfig(port=0, per_session=True, max_sessions=2),
        sessions=SessionConfig(idle_after_s=60.0, timeout_s=60.0, connect_grace_s=GRACE_S, tick_s=TICK_S,
                               admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=3)),
    )
    yield from _serve(cfg, model)


async def drain(server: LiveServer) -> None:
    """Close every session (a clean slate for a capacity test)."""
    for sid in list(server.manager.sessions):
        await server.app.state.peers.close_session(sid)  # type: ignore[attr-defined]
        server.manager.close(sid)


# -- 1. a failed create leaves nothing allocated, on every transport ---------------------------------------


def test_livekit_uses_the_common_scale_rule_and_failed_creates_free_everything(model) -> None:  # type: ignore[no-untyped-def]
    """No `--video-scale` (README's flags) and a LiveKit server that is not there (join fails: 502), or a
    create that raises inside (500): each time the session is closed and its slot freed."""
    pytest.importorskip("livekit.rtc")
    from worldcast.transport.livekit.config import LiveKitConfig

    dead = LiveKitConfig(url=f"ws://127.0.0.1:{free_port()}", api_key="k", api_secret="s" * 32, join_timeout_s=3.0)
    cfg = server_config(video_scale=None, livekit=dead,  # no frames needed: no warm-up (a quick start)
                        sessions=SessionConfig(warmup=False, admission=AdmissionConfig(policy=AdmissionPolicy.STATIC,
                                                                                       max_sessions=2)))
    for srv in _serve(cfg, model):
        worlds = srv.app.state.livekit  # type: ignore[attr-defined]
        assert worlds.video_scale == cfg.scale_for(model) == 4  # 64 px -> 256 px, as WebRTC and fMP4
        pool = srv.manager.engines[0].worker.pool
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            for i in range(4):  # more than the 2 slots: a leak would show as a 503
                # a room the server names: the join fails; a named room: asking the room service whether another
                # session's room has that name fails first (issue 31: a room belongs to its session)
                named = i % 2 == 1
                r = http.post("/v1/sessions", json={"transport": "livekit", **({"room": "nobody-here"} if named else {})})
                expect = "could not ask the LiveKit room service" if named else "could not join"
                assert r.status_code == 502 and expect in r.json()["detail"], r.text
                assert srv.manager.sessions == {} and worlds.worlds == {}

            async def boom(*a: Any, **k: Any) -> Any:
                raise RuntimeError("a bug inside the LiveKit path")

            worlds.serve = boom
            for _ in range(3):
                r = http.post("/v1/sessions", json={"transport": "livekit", "room": "r"})
                assert r.status_code == 500
                assert srv.manager.sessions == {}
            deadline = time.monotonic() + 10  # the device loop frees a closed session's slot when it comes round
            while pool.free_slots != pool.num_slots and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pool.free_slots == pool.num_slots
            assert http.post("/v1/sessions", json={}).status_code == 201  # the slots are free


# -- 2. capacity is held only by viewers or a short, named grace ------------------------------------------


async def test_silent_sockets_and_unconnected_offers_hold_no_slot_and_retry_after_is_true(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.dreamverse import serve as dreamverse_serve
    from worldcast.transport.stream import connection as stream_connection

    monkeypatch.setattr(dreamverse_serve, "INIT_TIMEOUT_S", 1.5)
    monkeypatch.setattr(stream_connection, "AUTH_TIMEOUT_S", 1.5)
    await drain(server)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        # silent Dreamverse sockets get no session at all; they are told and closed after the init timeout
        silent = [await connect(ws_base(server.url) + "/ws", compression=None) for _ in range(4)]
        await asyncio.sleep(0.3)
        assert server.manager.sessions == {}
        for ws in silent:
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert first["type"] == "queue_status"
            err = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert err["error_code"] == "init_timeout"
            await asyncio.wait_for(ws.wait_closed(), 10)
            assert ws.close_code == 4408
        assert server.manager.sessions == {}
        # sessions whose offers never connect, and one that never even offers, fill the server ...
        made, pcs = [], []
        for _ in range(2):
            sid, h = await new_session(http)
            pc = await offering_pc()
            r = await http.post(f"/v1/sessions/{sid}/webrtc", json={"sdp": pc.localDescription.sdp, "type": "offer"},
                                headers=h)
            assert r.status_code == 200
            await pc.close()  # never applies the answer
            made.append((sid, h))
            pcs.append(pc)
        sid3, h3 = await new_session(http)
        # ... an unauthenticated stream socket on it holds nothing either
        stream = await connect(ws_base(server.url) + f"/v1/sessions/{sid3}/stream", compression=None)
        t_full = time.monotonic()
        r = await http.post("/v1/sessions", json={})
        assert r.status_code == 503
        retry_after = float(r.headers["Retry-After"])
        # the truth: the first release is due within the grace (or the negotiation timeout) plus a tick
        assert 1 <= retry_after <= max(GRACE_S, NEGOTIATION_TIMEOUT_S) + TICK_S + 1, retry_after
        await asyncio.sleep(max(0.0, t_full + retry_after - time.monotonic()))

        async def admitted() -> bool:
            r = await http.post("/v1/sessions", json={})
            if r.status_code == 201:
                s = r.json()
                await http.delete(f"/v1/sessions/{s['session_id']}", headers={"Authorization": f"Bearer {s['token']}"})
            return r.status_code == 201

        await until(admitted, SLACK_S, "a create admitted once Retry-After had passed")
        await until(lambda: server.manager.sessions == {}, GRACE_S + NEGOTIATION_TIMEOUT_S + SLACK_S,
                    "every viewerless session released")
        for sid, h in made + [(sid3, h3)]:
            assert await info(http, sid, h) is None
        await stream.close()
        # a session with a connected viewer is kept far past the grace
        from worldcast.transport.clients import StreamClient

        async with await StreamClient.connect(server.url, seed=3) as c:
            await c.next_frame()
            await asyncio.sleep(GRACE_S + 3 * TICK_S + 1)
            assert c.session_id in server.manager.sessions
            assert server.manager.release_at_s(server.manager.sessions[c.session_id]) is None


# -- 3. nobody without a token learns which ids exist ------------------------------------------------------


async def test_unknown_and_real_ids_answer_alike_on_every_surface(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.stream import connection as stream_connection

    monkeypatch.setattr(stream_connection, "AUTH_TIMEOUT_S", 1.0)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await drain(server)
        real, _h = await new_session(http)
        unknown = "0123456789abcdef"
        offer = {"sdp": "v=0\r\n", "type": "offer"}
        for tokens in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic eA=="}):
            for method, path, body in (("GET", "", None), ("DELETE", "", None), ("POST", "/webrtc", offer),
                                       ("POST", "/rpc", {"id": 1, "method": "get_state"}),
                                       ("POST", "/webrtc", None), ("POST", "/rpc", [])):
                a = await http.request(method, f"/v1/sessions/{real}{path}", json=body, headers=tokens)
                b = await http.request(method, f"/v1/sessions/{unknown}{path}", json=body, headers=tokens)
                assert (a.status_code, a.content) == (b.status_code, b.content), (method, path, tokens, a.text)
                assert a.status_code in (401, 404), a.text
        assert (await http.get(f"/v1/sessions/{real}", headers=_h)).status_code == 200  # untouched

        async def ws_answer(sid: str, headers: dict[str, str], first: str | None) -> tuple[Any, int | None]:
            async with connect(ws_base(server.url) + f"/v1/sessions/{sid}/stream", additional_headers=headers,
                               compression=None) as ws:
                if first is not None:
                    await ws.send(first)
                msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
                await asyncio.wait_for(ws.wait_closed(), 10)
                return msg, ws.close_code

        for headers, first in (({}, None), ({"Authorization": "Bearer nope"}, None), ({}, '{"type": "hello"}'),
                               ({}, json.dumps({"type": "auth", "token": "nope"}))):
            a, b = await asyncio.gather(ws_answer(real, headers, first), ws_answer(unknown, headers, first))
            assert a == b, (headers, first, a, b)
        # /metrics on the API port names no session; the internal listener has bounded, opted-in series
        metrics = (await http.get("/metrics")).text
        assert real not in metrics and "worldcast_session_frames" not in metrics
        port = server.app.state.metrics_port  # type: ignore[attr-defined]
        await drain(server)
        sids = [(await new_session(http))[0] for _ in range(3)]
        internal = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        labelled = [s for s in sids if f'session="{s}"' in internal]
        assert labelled == sids[1:] and "worldcast_session_series_omitted 1.0" in internal  # the 2 newest only
        assert "worldcast_step_seconds" in internal  # and every aggregate series
        await drain(server)


# -- 4. one flood verdict for every message kind, answered by summaries ----------------------------------------


async def test_bad_json_and_direction_floods_on_the_stream_are_summarised_and_cut_off(server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.clients import StreamClient

    await drain(server)
    async with await StreamClient.connect(server.url, mode="directing", seed=4) as c:
        # a burst of 600 directions (under the flood verdict's 1,000 beyond the abuse rate): a few summaries,
        # not 600 errors; the counts add up
        n = 600
        for i in range(n):
            await c.send_raw(json.dumps({"type": "direction", "id": f"f{i}", "prompt": "a snowy field"}))
        await until(lambda: sum(e.get("count", 1) for e in c.events if e["event"] == "error") +
                    sum(1 for e in c.events if e["event"] == "direction_ack") >= n, 20, "every direction answered")
        errors = [e for e in c.events if e["event"] == "error"]
        acks = [e for e in c.events if e["event"] == "direction_ack"]
        assert len(errors) <= 12 and acks, (len(errors), len(acks))
        assert sum(e["count"] for e in errors) + len(acks) == n and c.closed_code is None
        assert {k for e in errors for k in e.get("counts", {})} <= {"rate_limited"}
        # a sustained bad-JSON flood: summaries, then a disconnect and close 1008
        t0 = time.monotonic()
        while c.closed_code is None and time.monotonic() - t0 < 20:
            try:
                for _ in range(50):
                    await c.send_raw("{junk")
            except Exception:  # noqa: BLE001 - closed under us: the point
                break
            await asyncio.sleep(0.01)
        await until(lambda: c.closed_code is not None, 10, "the flooder's stream closed")
        assert c.closed_code == 1008
        verdict = [e for e in c.events if e["event"] == "disconnect"]
        assert verdict and verdict[0]["reason"] == "flood"
        bad = [e for e in c.events if e["event"] == "error" and e["code"] == "bad_json"]
        assert 1 <= len(bad) <= 2 * (time.monotonic() - t0) / 0.5 + 4  # one per half-second at most


async def test_a_dreamverse_flood_is_cut_off_before_and_after_session_init(server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.dreamverse.serve import MAX_PRE_INIT_MESSAGES

    await drain(server)
    async with connect(ws_base(server.url) + "/ws", compression=None, max_size=2**24) as ws:
        for _ in range(MAX_PRE_INIT_MESSAGES + 5):
            await ws.send("{junk")
        msgs = []
        with contextlib.suppress(ConnectionClosed):
            async for m in ws:
                if isinstance(m, str):
                    msgs.append(json.loads(m))
        assert ws.close_code == 1008 and msgs[-1]["error_code"] == "flood"
        assert len([m for m in msgs if m["type"] == "error"]) <= 4  # coalesced, then the verdict
    assert server.manager.sessions == {}
    async with connect(ws_base(server.url) + "/ws", compression=None, max_size=2**24) as ws:
        await ws.send(json.dumps({"type": "session_init_v2", "curated_prompts": ["a green meadow"]}))
        t0, errors, closed = time.monotonic(), 0, False
        while time.monotonic() - t0 < 20 and not closed:
            try:
                for _ in range(50):
                    await ws.send(json.dumps({"type": "nonsense"}))
                while True:
                    m = await asyncio.wait_for(ws.recv(), 0.005)
                    if isinstance(m, str) and json.loads(m).get("type") == "error":
                        errors += 1
            except TimeoutError:
                pass
            except Exception:  # noqa: BLE001 - closed under us
                closed = True
        await asyncio.wait_for(ws.wait_closed(), 10)
        assert ws.close_code == 1008
    await until(lambda: server.manager.sessions == {}, SLACK_S, "the flooder's session closed")


# -- 7. one prompt rule on every surface ---------------------------------------------------------------------


INVISIBLE = ["\u200b", "\ufeff", "\u200f\u200e", "\u200d", "\U000e0041\U000e0042", " \u3164 ", "\u0301"]


async def test_invisible_prompts_are_refused_and_format_characters_stripped_everywhere(server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.clients import StreamClient
    from worldcast.transport.livekit.worker import DispatchMetadata

    await drain(server)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for p in INVISIBLE:
            r = await http.post("/v1/sessions", json={"prompt": p})
            assert r.status_code == 422 and "prompt" in r.json()["detail"], (p, r.text)
        r = await http.post("/v1/sessions", json={"prompt": "a\u200b snowy\u2060 field\U000e0041"})
        s = r.json()
        h = {"Authorization": f"Bearer {s['token']}"}
        assert (await http.get(f"/v1/sessions/{s['session_id']}", headers=h)).json()["prompt"] == "a snowy field"
        url = f"/v1/sessions/{s['session_id']}/rpc"
        for p in INVISIBLE:
            r = await http.post(url, json={"id": 1, "method": "set_prompt", "params": {"prompt": p}}, headers=h)
            assert r.status_code == 400 and r.json()["error"]["code"] == -32602, (p, r.text)
        await http.delete(f"/v1/sessions/{s['session_id']}", headers=h)
    async with await StreamClient.connect(server.url, mode="directing", seed=5) as c:
        for i, p in enumerate(INVISIBLE):
            _, fut, _ = await c.send_direction(p, direction_id=f"inv{i}")
            ev = await asyncio.wait_for(fut, 10)
            assert ev["event"] == "error" and ev["code"] == "bad_direction", ev
        r = await c.rpc("", raw={"id": 7, "method": "set_prompt", "params": {"prompt": "\u200b"}})
        assert r is not None and r["error"]["code"] == -32602  # (directing refuses set_prompt anyway)
    for p in INVISIBLE:
        with pytest.raises(ValueError, match="prompt"):
            DispatchMetadata.parse(json.dumps({"prompt": p}))
    assert DispatchMetadata.parse(json.dumps({"prompt": "\ufeffa meadow"})).prompt == "a meadow"
    async with connect(ws_base(server.url) + "/ws", compression=None, max_size=2**24) as ws:
        await ws.send(json.dumps({"type": "session_init_v2", "curated_prompts": ["\u200b", "a meadow"]}))
        got: list[dict[str, Any]] = []
        while not any(m.get("type") == "gpu_assigned" for m in got):
            m = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(m, str):
                got.append(json.loads(m))
        assert any(m.get("error_code") == "bad_prompt" and "curated prompt 1" in m["message"] for m in got)
        await ws.send(json.dumps({"type": "append_prompt", "prompt": "\u200b\u200d", "prompt_id": "x"}))
        while True:
            m = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(m, str) and json.loads(m).get("type") == "error":
                assert json.loads(m)["error_code"] == "bad_prompt"
                break
        await ws.send(json.dumps({"type": "leave"}))


async def test_livekit_rpcs_use_the_same_prompt_rule(server, model) -> None:  # type: ignore[no-untyped-def]
    """The world's RPCs (transport/livekit/rpc.py) on a real session, called as the room would."""
    pytest.importorskip("livekit.rtc")
    from livekit import rtc

    from worldcast.transport.livekit.rpc import LiveKitRpc

    s = await server.manager.create(seed=6)
    try:
        rpc = LiveKitRpc(s, user_identity=lambda: "user")
        with pytest.raises(rtc.RpcError) as e:
            await rpc.invoke("set_prompt", "user", json.dumps({"prompt": "\u200b"}))
        assert e.value.code == 1512
        assert json.loads(await rpc.invoke("set_prompt", "user", json.dumps({"prompt": "\u200ba lake"}))) == {
            "prompt": "a lake"}
    finally:
        server.manager.close(s.id)


# -- 8. content types --------------------------------------------------------------------------------------


async def test_json_routes_refuse_other_content_types_and_bodies_without_one(server) -> None:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await drain(server)
        sid, h = await new_session(http)
        for path in ("/v1/sessions", f"/v1/sessions/{sid}/webrtc", f"/v1/sessions/{sid}/rpc"):
            for headers, body in (({"Content-Type": "text/plain"}, b"{}"), ({"Content-Type": "text/plain"}, b""),
                                  ({}, b"{}"), ({"Content-Type": "application/x-www-form-urlencoded"}, b"a=1"),
                                  ({"Content-Type": "application/jsonx"}, b"{}")):
                r = await http.post(path, content=body, headers={**h, **headers})
                assert r.status_code == 415 and "application/json" in r.json()["detail"], (path, headers, r.text)
            # chunked, no Content-Type: read (bounded) and refused all the same
            async def chunks() -> Any:
                yield b"{"
                yield b"}"

            r = await http.post(path, content=chunks(), headers=h)
            assert r.status_code == 415, (path, r.text)
        # an empty body without a type means "no body": defaults on create, 422 where a body is needed
        r = await http.post("/v1/sessions", content=b"")
        assert r.status_code == 201
        assert (await http.post(f"/v1/sessions/{sid}/rpc", content=b"", headers=h)).status_code == 422
        r = await http.post(f"/v1/sessions/{sid}/rpc", json={"id": 1, "method": "get_state"},
                            headers={**h, "Content-Type": "application/json; charset=utf-8"})
        assert r.status_code == 200
        await drain(server)


# -- 9. slow request heads and connections per client -----------------------------------------------------------------


def test_slow_request_heads_are_closed_and_one_client_cannot_hold_many_connections(server) -> None:  # type: ignore[no-untyped-def]
    host, port = server.url.removeprefix("http://").split(":")
    stats = server.app.state.connection_guard  # type: ignore[attr-defined]
    before = stats.head_timeouts
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 64
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(4)]
    t0 = time.monotonic()
    answers = [b""] * len(socks)
    for i in range(int(HEAD_TIMEOUT_S + SLACK_S)):  # one byte a second each, bounded
        for k, sk in enumerate(socks):
            if answers[k]:
                continue
            try:
                sk.send(head[i:i + 1])
            except OSError:
                answers[k] = answers[k] or b"(reset)"
        for k, sk in enumerate(socks):
            sk.settimeout(0.0 if answers[k] else 1.0 / len(socks))
            try:
                answers[k] = answers[k] or sk.recv(200) or b"(closed)"
            except (BlockingIOError, TimeoutError, OSError):
                pass
        if all(answers):
            break
    took = time.monotonic() - t0
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
    assert took <= HEAD_TIMEOUT_S + SLACK_S and stats.head_timeouts - before >= len(socks)
    for sk in socks:
        sk.close()
    # a complete request still works, and keep-alive requests are not timed between requests
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
        time.sleep(HEAD_TIMEOUT_S + 0.5)
        assert http.get("/healthz").status_code == 200
    # one address may hold MAX_PER_CLIENT connections; the next is refused at once with 503
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(MAX_PER_CLIENT)]
    try:
        time.sleep(0.1)
        extra = socket.create_connection((host, int(port)), timeout=5)
        assert extra.recv(200).startswith(b"HTTP/1.1 503")
        extra.close()
    finally:
        for sk in held:
            sk.close()
    deadline = time.monotonic() + SLACK_S  # freed as they close: a new connection is served again
    while True:
        try:
            if httpx.get(server.url + "/healthz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "connections not freed"
        time.sleep(0.1)


# -- 11. the Python clients ----------------------------------------------------------------------------------------


async def test_clients_restart_seq_before_the_limit_and_handle_notifications_and_batches(server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.clients import StreamClient, WebRTCClient
    from worldcast.transport.clients.session_api import SEQ_MAX

    await drain(server)
    async with await WebRTCClient.connect(server.url, seed=7) as c:
        await c.next_frame()
        c.seq = SEQ_MAX - 3
        seqs = [c.send_action(keys=["w"]) for _ in range(2)] + [c.send_action(keys=["d"])]
        assert seqs == [SEQ_MAX - 2, SEQ_MAX - 1, 0]

        async def keys_d_applied() -> bool:
            return (await c.rpc("get_state"))["last_action_seq"] == 0

        await until(keys_d_applied, 10, "the restarted seq 0 applied by the server")
        t0 = time.monotonic()
        assert await c.rpc("", raw={"jsonrpc": "2.0", "method": "flush"}) is None
        assert time.monotonic() - t0 < 1.0  # at once, not after a timeout
        with pytest.raises(ValueError, match="batch"):
            await c.rpc("", raw=[{"jsonrpc": "2.0", "id": 1, "method": "flush"}])
        # raw text goes out unchecked (for error tests): the server's own refusal comes back, at once
        r = await asyncio.wait_for(c.rpc("", raw='[{"id": 1, "method": "flush"}]'), 5)
        assert r is not None and r["id"] is None and "batch" in r["error"]["message"]
        assert (await c.rpc("get_state"))["epoch"] == 1  # the notification ran
    async with await StreamClient.connect(server.url, seed=8) as s:
        await s.next_frame()
        s.seq = SEQ_MAX - 2
        assert [await s.send_action(keys=["a"]) for _ in range(2)] == [SEQ_MAX - 1, 0]
        assert await s.rpc("", raw={"jsonrpc": "2.0", "method": "flush"}) is None
        with pytest.raises(ValueError, match="batch"):
            await s.rpc("", raw=[{"id": 1, "method": "flush"}])
        await until(lambda: s.rpc("get_state"), 10, "get_state answers")
        st = await s.rpc("get_state")
        assert st is not None and st["epoch"] == 1 and st["last_action_seq"] == 0


# -- 10. memory after peaks ----------------------------------------------------------------------------------


async def test_closed_sessions_are_collected_and_the_heap_trimmed_after_closes(server) -> None:  # type: ignore[no-untyped-def]
    """A closed peer, its track and codec sit in reference cycles; the heap trimmer (transport/memory.py)
    collects them and gives the freed heap back once closes settle. (`make rss` measures the RSS.)"""
    import weakref

    from worldcast.transport.clients import StreamClient, WebRTCClient

    trimmer = server.app.state.heap_trimmer  # type: ignore[attr-defined]
    await drain(server)
    async with await WebRTCClient.connect(server.url, seed=9) as c, \
            await StreamClient.connect(server.url, seed=10) as s:
        await c.next_frame()
        await s.next_frame()
        peer = server.app.state.peers.live[c.session_id]  # type: ignore[attr-defined]
        stream = server.app.state.streams[s.session_id]  # type: ignore[attr-defined]
        refs = [weakref.ref(x) for x in (peer, peer.track, stream, stream.sink)]
        del peer, stream
        before = trimmer.trims
    await until(lambda: trimmer.trims > before, trimmer.delay_s + SLACK_S, "a heap trim after the closes")
    assert [r() for r in refs] == [None] * 4, "closed sessions' objects still alive after the trim"
    assert trimmer.last_collected >= 0 and trimmer.last_trim_ms is not None


def test_the_config_refuses_per_session_metrics_on_the_api_port() -> None:
    with pytest.raises(ValueError, match="separate listener"):
        MetricsConfig(per_session=True)
    with pytest.raises(ValueError, match="connect_grace_s"):
        SessionConfig(connect_grace_s=0)
    assert dataclasses.fields(ConnectionLimits)
