"""Viewer tokens and fMP4 spectators against a real server on loopback: what a viewer token may and may not do
on every surface, the read-only stream over the session's one encode, revocation, caps, a stalled spectator."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiortc import RTCPeerConnection
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, _serve, server_config
from tests.transport.test_ws_stream import small_buffer_socket, ws_url
from worldcast.sessions.viewers import ViewerConfig
from worldcast.transport.clients import StreamClient, StreamError
from worldcast.transport.errors import FORBIDDEN
from worldcast.transport.stream.fmp4 import SessionEncode

pytestmark = pytest.mark.timeout(180)

VIEWERS = ViewerConfig(max_tokens_per_session=3, max_spectators_per_session=2, max_spectators=3, stall_s=1.0)


@pytest.fixture(scope="module")
def server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    yield from _serve(server_config(viewers=VIEWERS), model)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def create(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def viewer(http: httpx.AsyncClient, s: dict[str, Any], **body: Any) -> dict[str, Any]:
    r = await http.post(f"/v1/sessions/{s['session_id']}/viewers", json=body, headers=auth(s["token"]))
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def until(cond: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        await asyncio.sleep(0.02)


async def aiortc_offer() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("control")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def test_a_viewer_token_is_minted_bounded_and_revoked(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        s = await create(http)
        sid = s["session_id"]
        v = await viewer(http, s, ttl_s=120)
        assert set(v) == {"viewer_id", "viewer_token", "whep_url", "stream_url", "expires_in_s", "livekit"}
        assert v["whep_url"] == f"{server.url}/v1/sessions/{sid}/whep" and v["livekit"] is None
        assert v["stream_url"] == ws_url(server.url, sid) and 119 < v["expires_in_s"] <= 120
        assert (await viewer(http, s))["expires_in_s"] == pytest.approx(VIEWERS.default_ttl_s, abs=1)
        url = f"/v1/sessions/{sid}/viewers"
        for body, needle in (({"ttl_s": 5}, "ttl_s"), ({"ttl_s": 1e9}, "ttl_s"), ({"ttl_s": "x"}, "ttl_s"),
                             ({"role": "controller"}, "role")):
            r = await http.post(url, json=body, headers=auth(s["token"]))
            assert r.status_code == 422 and needle in r.json()["detail"], (body, r.text)
        assert (await http.post(url)).status_code == 401
        await viewer(http, s)
        r = await http.post(url, headers=auth(s["token"]))  # the session's cap: 3 live tokens
        assert r.status_code == 429 and "3 live viewer tokens" in r.json()["detail"]
        assert (await http.delete(f"{url}/{v['viewer_id']}", headers=auth(s["token"]))).status_code == 204
        assert (await http.delete(f"{url}/{v['viewer_id']}", headers=auth(s["token"]))).status_code == 404
        await viewer(http, s)  # its place is free again
        info = (await http.get(f"/v1/sessions/{sid}", headers=auth(s["token"]))).json()
        assert info["viewer_tokens"] == 3
        await http.delete(f"/v1/sessions/{sid}", headers=auth(s["token"]))


async def test_a_viewer_token_is_refused_as_a_wrong_token_on_every_controller_surface(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        s, other = await create(http), await create(http)
        sid = s["session_id"]
        v = await viewer(http, s)
        pc, sdp = await aiortc_offer()
        await pc.close()
        rpc = f"/v1/sessions/{sid}/rpc"
        attempts: list[tuple[str, str, dict[str, Any] | None]] = [
            ("GET", f"/v1/sessions/{sid}", None),
            ("POST", rpc, {"id": 1, "method": "flush"}),
            ("POST", rpc, {"id": 2, "method": "cancel"}),
            ("POST", rpc, {"id": 3, "method": "resume"}),
            ("POST", rpc, {"id": 4, "method": "set_prompt", "params": {"prompt": "lava"}}),
            ("POST", f"/v1/sessions/{sid}/webrtc", {"sdp": sdp, "type": "offer"}),
            ("POST", f"/v1/sessions/{sid}/viewers", {}),
            ("DELETE", f"/v1/sessions/{sid}/viewers/{v['viewer_id']}", None),
            ("GET", f"/v1/sessions/{other['session_id']}", None),
            ("POST", f"/v1/sessions/{other['session_id']}/rpc", {"id": 5, "method": "flush"}),
            ("DELETE", f"/v1/sessions/{sid}", None),
        ]
        for method, url, body in attempts:
            as_viewer = await http.request(method, url, json=body, headers=auth(v["viewer_token"]))
            wrong = await http.request(method, url, json=body, headers=auth("not-a-token-of-anyone"))
            assert (as_viewer.status_code, as_viewer.json()) == (wrong.status_code, wrong.json()) == (
                404, {"detail": "no such session for this token"}), (method, url)
        info = (await http.get(f"/v1/sessions/{sid}", headers=auth(s["token"]))).json()
        assert info["state"] != "closed" and info["epoch"] == 0 and info["viewer_tokens"] == 1
        assert info["prompt"] == s["model"]["default_prompt"] and not info["cancelled"]
        for x in (s, other):
            await http.delete(f"/v1/sessions/{x['session_id']}", headers=auth(x["token"]))


async def test_a_spectator_watches_the_one_encode_read_only(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=3) as c:
        sid = c.session_id
        await c.next_frame()
        v = await viewer(http, {"session_id": sid, "token": c.token})
        spec = await StreamClient.attach(server.url, sid, v["viewer_token"], model=c.model, auth="message")
        try:
            start = await spec.wait_event(lambda e: e["event"] == "stream_start", past=True)
            assert start["view_only"] is True and start["prompt"] is None
            frames = [await spec.next_frame() for _ in range(5)]
            assert frames[0].keyframe and all(b.frame_index > a.frame_index for a, b in zip(frames, frames[1:]))
            session = server.manager.sessions[sid]
            encodes = [e for e in session.frames.shared.values() if isinstance(e, SessionEncode)]
            assert len(encodes) == 1 and len(encodes[0].sinks) == 2, "one encode for the controller and the spectator"
            assert server.app.state.streams[sid].spectator is None  # the controller's stream stays the one registered
            assert len(session.viewers.spectators) == 1 and session.viewer_count == 1  # a spectator is no viewer
            before = session.inputs.actions.last_seq
            await spec.send_action(keys=["d"])
            rejected = await spec.wait_event(lambda e: e["event"] == "action_rejected")
            assert rejected["code"] == FORBIDDEN and "viewer token can only watch" in rejected["message"]
            for method in ("flush", "cancel", "pause"):
                with pytest.raises(StreamError) as e:
                    await spec.rpc(method)
                assert e.value.code == FORBIDDEN
            with pytest.raises(StreamError) as e:
                await spec.direct("a snowy landscape")
            assert e.value.code == "view_only"
            assert session.inputs.current_epoch() == 0 and not session.paused and not session.cancelled
            assert session.inputs.actions.last_seq == before
            await spec.send_raw(json.dumps({"type": "ping", "t": 7}))
            assert (await spec.wait_event(lambda e: e["event"] == "pong"))["t"] == 7
            seq = await c.send_action(keys=["w"])  # the controller still acts, and its stream goes on
            await c.wait_event(lambda e: e["event"] == "media" and e["action_seq"] >= seq, timeout_s=15)
            assert c.closed_code is None and spec.closed_code is None
        finally:
            await spec.aclose(delete=False)
        await until(lambda: not server.manager.sessions[sid].viewers.spectators, "the spectator released")
        assert len(encodes[0].sinks) == 1
        await c.next_frame()


async def test_revoking_a_viewer_closes_its_stream_and_its_token(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=4) as c:
        sid = c.session_id
        s = {"session_id": sid, "token": c.token}
        v = await viewer(http, s)
        spec = await StreamClient.attach(server.url, sid, v["viewer_token"], model=c.model)
        try:
            await spec.next_frame()
            r = await http.delete(f"/v1/sessions/{sid}/viewers/{v['viewer_id']}", headers=auth(c.token))
            assert r.status_code == 204
            err = await spec.wait_event(lambda e: e["event"] == "error", past=True)
            assert err["code"] == "viewer_revoked"
            await until(lambda: spec.closed_code is not None, "the spectator's stream closed")
            assert spec.closed_code == 4403
            assert not server.manager.sessions[sid].viewers.spectators
        finally:
            await spec.aclose(delete=False)
        with pytest.raises(StreamError) as e:  # the revoked token opens nothing
            await StreamClient.attach(server.url, sid, v["viewer_token"])
        assert e.value.code == "session_not_found"
        expired = await viewer(http, s)  # a token that has run out is refused alike
        session = server.manager.sessions[sid]
        session.viewers.tokens[expired["viewer_id"]].expires_at_s = 0.0
        with pytest.raises(StreamError) as e:
            await StreamClient.attach(server.url, sid, expired["viewer_token"])
        assert e.value.code == "session_not_found"
        await c.next_frame()
        assert c.closed_code is None


async def test_spectator_caps_refuse_with_the_reason_and_release_on_leave(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        a, b = await create(http), await create(http)
        va, vb = await viewer(http, a), await viewer(http, b)
        opened: list[StreamClient] = []
        try:
            for _ in range(2):
                opened.append(await StreamClient.attach(server.url, a["session_id"], va["viewer_token"],
                                                        decode=False))
            with pytest.raises(StreamError) as e:  # this session's cap (2)
                await StreamClient.attach(server.url, a["session_id"], va["viewer_token"], decode=False)
            assert e.value.code == "spectators_full" and "this session has 2 spectators" in str(e.value)
            opened.append(await StreamClient.attach(server.url, b["session_id"], vb["viewer_token"], decode=False))
            with pytest.raises(StreamError) as e:  # the server's cap (3)
                await StreamClient.attach(server.url, b["session_id"], vb["viewer_token"], decode=False)
            assert e.value.code == "spectators_full" and "the server has 3 spectators" in str(e.value)
            await opened.pop(0).aclose(delete=False)
            await until(lambda: len(server.manager.sessions[a["session_id"]].viewers.spectators) == 1,
                        "the leaving spectator released")
            opened.append(await StreamClient.attach(server.url, b["session_id"], vb["viewer_token"], decode=False))
        finally:
            for c in opened:
                await c.aclose(delete=False)
            for x in (a, b):
                await http.delete(f"/v1/sessions/{x['session_id']}", headers=auth(x["token"]))


async def test_a_spectator_that_stops_reading_is_dropped_and_the_controller_goes_on(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=5) as c:
        sid = c.session_id
        v = await viewer(http, {"session_id": sid, "token": c.token})
        session = server.manager.sessions[sid]
        sock = small_buffer_socket(server.url)
        async with connect(ws_url(server.url, sid), sock=sock, compression=None, max_queue=1,
                           additional_headers=auth(v["viewer_token"])) as ws:
            await asyncio.wait_for(ws.recv(), 15)  # stream_start: admitted
            assert len(session.viewers.spectators) == 1
            # nothing more is read: the spectator's sends back up until one waits past stall_s
            await until(lambda: not session.viewers.spectators, "the stalled spectator dropped", timeout_s=60)
        n = c.media_segments
        # a segment's "media" event comes before its bytes: wait for the bytes themselves
        await until(lambda: c.media_segments > n, "the controller's next media segment", timeout_s=15)
        assert c.closed_code is None
        await c.next_frame()
