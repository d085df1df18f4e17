"""WHEP egress against a real server on loopback, played by a real aiortc peer that decodes the video: setup,
teardown, every refusal the route documents, revocation, a player that never completes ICE, the caps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import av
import httpx
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from tests.conftest import LiveServer, _serve, server_config
from worldcast.sessions.viewers import ViewerConfig
from worldcast.transport.clients import StreamClient

pytestmark = pytest.mark.timeout(180)

VIEWERS = ViewerConfig(max_spectators_per_session=2, max_spectators=3)
NEGOTIATION_TIMEOUT_S = 3.0
SDP = {"Content-Type": "application/sdp"}


@pytest.fixture(scope="module")
def server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    yield from _serve(server_config(viewers=VIEWERS, negotiation_timeout_s=NEGOTIATION_TIMEOUT_S), model)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def until(cond: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        await asyncio.sleep(0.02)


class Player:
    """A WHEP player: an aiortc peer offering recvonly video (and, if asked, a data channel)."""

    def __init__(self, *, video: bool = True, audio: bool = False, data_channel: bool = False) -> None:
        self.pc = RTCPeerConnection()
        if video:
            self.pc.addTransceiver("video", direction="recvonly")
        if audio:
            self.pc.addTransceiver("audio", direction="recvonly")
        self.channel = self.pc.createDataChannel("actions") if data_channel else None
        self.track: Any = None
        self.got_track = asyncio.Event()
        self.location: str | None = None

        @self.pc.on("track")
        def _on_track(track: Any) -> None:
            self.track = track
            self.got_track.set()

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())  # aiortc gathers before returning
        return self.pc.localDescription.sdp  # type: ignore[no-any-return]

    async def play(self, http: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
        r = await http.post(url, content=await self.offer(), headers=SDP | auth(token))
        if r.status_code == 201:
            self.location = r.headers["location"]
            await self.pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
        return r

    async def frames(self, n: int) -> list[av.VideoFrame]:
        await asyncio.wait_for(self.got_track.wait(), 15)
        return [await asyncio.wait_for(self.track.recv(), 15) for _ in range(n)]

    async def close(self) -> None:
        await self.pc.close()


async def viewer(http: httpx.AsyncClient, sid: str, token: str) -> dict[str, Any]:
    r = await http.post(f"/v1/sessions/{sid}/viewers", headers=auth(token))
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_a_whep_player_plays_the_session_and_leaves_with_delete(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=1) as c:
        sid = c.session_id
        await c.next_frame()
        v = await viewer(http, sid, c.token)
        player = Player(audio=True, data_channel=True)  # a player's usual audio m-line; a data channel it may not use
        try:
            r = await player.play(http, v["whep_url"], v["viewer_token"])
            assert r.status_code == 201 and r.headers["content-type"] == "application/sdp", r.text
            assert r.text.startswith("v=0") and "m=video" in r.text
            assert player.location is not None and player.location.startswith(f"/v1/sessions/{sid}/whep/")
            frames = await player.frames(5)
            assert all(f.width == 64 * server.config.video_scale for f in frames)
            assert all(b.pts > a.pts for a, b in zip(frames, frames[1:])), "90 kHz PTS, increasing"
            session = server.manager.sessions[sid]
            assert len(session.viewers.spectators) == 1 and session.viewer_count == 1  # a spectator, not a viewer
            assert player.channel is not None
            await until(lambda: player.channel.readyState == "open", "the player's data channel opened")
            before = session.inputs.actions.last_seq
            player.channel.send('{"seq": 1000, "t": 0, "keys": ["d"], "mouse": [0, 0]}')  # never reaches the session
            seq = await c.send_action(keys=["w"])
            await c.wait_event(lambda e: e["event"] == "media" and e["action_seq"] >= seq, timeout_s=15)
            assert session.inputs.actions.last_seq == seq and seq != 1000 and before != 1000
            assert (await http.options(v["whep_url"])).headers["allow"] == "OPTIONS, POST"
            assert (await http.options(player.location)).headers["allow"] == "DELETE, OPTIONS"
            r = await http.patch(player.location, content="a=end-of-candidates\r\n",
                                 headers={"Content-Type": "application/trickle-ice-sdpfrag"} | auth(v["viewer_token"]))
            assert r.status_code == 405 and r.headers["allow"] == "DELETE, OPTIONS" and "trickle" in r.json()["detail"]
            r = await http.delete(player.location, headers=auth(v["viewer_token"]))
            assert r.status_code == 200
            assert not server.app.state.whep.peers and not session.viewers.spectators
            assert session.frames.sinks and len(session.frames.sinks) == 1  # only the controller's stream
            await until(lambda: player.pc.connectionState in ("closed", "failed"), "the player's peer ended", 40)
            assert (await http.delete(player.location, headers=auth(v["viewer_token"]))).status_code == 404
            await c.next_frame()  # the controller goes on
            assert c.closed_code is None
        finally:
            await player.close()


async def test_every_whep_refusal_is_precise_and_holds_nothing(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        a = (await http.post("/v1/sessions", json={})).json()
        b = (await http.post("/v1/sessions", json={})).json()
        url_a = f"/v1/sessions/{a['session_id']}/whep"
        va, vb = await viewer(http, a["session_id"], a["token"]), await viewer(http, b["session_id"], b["token"])
        revoked, expired = (await viewer(http, a["session_id"], a["token"]),
                            await viewer(http, a["session_id"], a["token"]))
        await http.delete(f"/v1/sessions/{a['session_id']}/viewers/{revoked['viewer_id']}", headers=auth(a["token"]))
        server.manager.sessions[a["session_id"]].viewers.tokens[expired["viewer_id"]].expires_at_s = 0.0
        p = Player()
        good = await p.offer()
        await p.close()
        dc = Player(video=False, data_channel=True)
        dc_only = await dc.offer()
        await dc.close()
        au = Player(video=False, audio=True)
        audio_only = await au.offer()
        await au.close()
        cases: list[tuple[str, str, dict[str, str], int, str]] = [
            (url_a, good, SDP, 401, "missing"),
            (url_a, good, SDP | {"Authorization": "Basic eDp5"}, 401, "missing"),
            (url_a, good, SDP | auth("wrong"), 401, "opens no session"),
            (url_a, good, SDP | auth(revoked["viewer_token"]), 401, "opens no session"),
            (url_a, good, SDP | auth(expired["viewer_token"]), 401, "opens no session"),
            (url_a, good, SDP | auth(vb["viewer_token"]), 404, "no such session for this token"),
            ("/v1/sessions/0123456789abcdef/whep", good, SDP | auth(va["viewer_token"]), 404, "no such session"),
            (url_a, good, {"Content-Type": "text/plain"} | auth(va["viewer_token"]), 415, "application/sdp"),
            (url_a, good, {"Content-Type": "application/json"} | auth(va["viewer_token"]), 415, "application/sdp"),
            (url_a, "", auth(va["viewer_token"]), 415, "application/sdp"),
            (url_a, "v=0\r\nthis is not sdp\r\n", SDP | auth(va["viewer_token"]), 400, "invalid SDP offer"),
            (url_a, dc_only, SDP | auth(va["viewer_token"]), 400, "no video m-line"),
            (url_a, audio_only, SDP | auth(va["viewer_token"]), 400, "no video m-line"),
            (url_a, good.replace("a=recvonly", "a=inactive"), SDP | auth(va["viewer_token"]), 400, "inactive"),
        ]
        for url, body, headers, status, needle in cases:
            r = await http.post(url, content=body.encode(), headers=headers)
            assert r.status_code == status and needle in r.json()["detail"], (headers, r.status_code, r.text)
            if status == 401:
                assert r.headers["www-authenticate"] == "Bearer"
        r = await http.post(url_a, content=b"\xff\xfe", headers=SDP | auth(va["viewer_token"]))
        assert r.status_code == 400 and "UTF-8" in r.json()["detail"]
        assert not server.app.state.whep.peers
        assert not any(s.viewers.spectators for s in server.manager.sessions.values())
        for s in (a, b):
            await http.delete(f"/v1/sessions/{s['session_id']}", headers=auth(s["token"]))


async def test_delete_of_another_sessions_or_viewers_resource_is_404(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=2) as c:
        b = (await http.post("/v1/sessions", json={})).json()
        sid = c.session_id
        v, other_viewer = await viewer(http, sid, c.token), await viewer(http, sid, c.token)
        vb = await viewer(http, b["session_id"], b["token"])
        player = Player()
        try:
            assert (await player.play(http, v["whep_url"], v["viewer_token"])).status_code == 201
            rid = player.location.rsplit("/", 1)[1]  # type: ignore[union-attr]
            for url, token in ((f"/v1/sessions/{b['session_id']}/whep/{rid}", vb["viewer_token"]),
                               (f"/v1/sessions/{b['session_id']}/whep/{rid}", b["token"]),
                               (player.location, vb["viewer_token"]),
                               (player.location, other_viewer["viewer_token"]),
                               (f"/v1/sessions/{sid}/whep/nope", v["viewer_token"])):
                r = await http.delete(url, headers=auth(token))  # type: ignore[arg-type]
                assert r.status_code == 404, (url, r.text)
            assert len(server.app.state.whep.peers) == 1
            # the controller may end any of its session's resources
            assert (await http.delete(player.location, headers=auth(c.token))).status_code == 200  # type: ignore[arg-type]
            assert not server.app.state.whep.peers
        finally:
            await player.close()
            await http.delete(f"/v1/sessions/{b['session_id']}", headers=auth(b["token"]))


async def test_revocation_and_the_session_closing_end_whep_peers(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        async with await StreamClient.connect(server.url, seed=3) as c:
            sid = c.session_id
            v = await viewer(http, sid, c.token)
            p1, p2 = Player(), Player()
            try:
                assert (await p1.play(http, v["whep_url"], v["viewer_token"])).status_code == 201
                assert (await p2.play(http, v["whep_url"], c.token)).status_code == 201  # the session's own token
                await p1.frames(1)
                r = await http.delete(f"/v1/sessions/{sid}/viewers/{v['viewer_id']}", headers=auth(c.token))
                assert r.status_code == 204
                peers = server.app.state.whep.peers
                await until(lambda: len(peers) == 1, "the revoked viewer's peer closed")
                assert next(iter(peers.values())).spectator.viewer_id is None
                await until(lambda: p1.pc.connectionState in ("closed", "failed"), "the player's peer ended", 40)
            finally:
                await p1.close()
        # the controller's stream client deleted the session on exit: the other peer closes with it
        await until(lambda: not server.app.state.whep.peers, "the session's last WHEP peer closed")
        await p2.close()


async def test_a_player_that_never_completes_ice_is_closed_and_released(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=4) as c:
        v = await viewer(http, c.session_id, c.token)
        p = Player()
        try:
            r = await http.post(v["whep_url"], content=await p.offer(), headers=SDP | auth(v["viewer_token"]))
            assert r.status_code == 201  # the answer is never applied: ICE never completes
            session = server.manager.sessions[c.session_id]
            assert len(session.viewers.spectators) == 1
            await until(lambda: not session.viewers.spectators, "the unconnected player released",
                        timeout_s=NEGOTIATION_TIMEOUT_S + 10)
            assert not server.app.state.whep.peers and len(session.frames.sinks) == 1
        finally:
            await p.close()


async def test_spectator_caps_count_whep_and_fmp4_and_say_why(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=5) as c:
        b = (await http.post("/v1/sessions", json={})).json()
        v = await viewer(http, c.session_id, c.token)
        vb = await viewer(http, b["session_id"], b["token"])
        players = [Player() for _ in range(4)]
        fmp4: StreamClient | None = None
        try:
            assert (await players[0].play(http, v["whep_url"], v["viewer_token"])).status_code == 201
            fmp4 = await StreamClient.attach(server.url, c.session_id, v["viewer_token"], decode=False)
            r = await players[1].play(http, v["whep_url"], v["viewer_token"])  # the session's cap: 2
            assert r.status_code == 429 and "this session has 2 spectators" in r.json()["detail"]
            assert (await players[2].play(http, vb["whep_url"], vb["viewer_token"])).status_code == 201
            r = await players[3].play(http, vb["whep_url"], vb["viewer_token"])  # the server's cap: 3
            assert r.status_code == 503 and "the server has 3 spectators" in r.json()["detail"]
            assert int(r.headers["retry-after"]) >= 1
            assert len(server.app.state.whep.peers) == 2
            text = (await http.get("/metrics")).text
            assert 'worldcast_spectators{kind="whep"} 2.0' in text and 'worldcast_spectators{kind="fmp4"} 1.0' in text
            await fmp4.aclose(delete=False)
            await until(lambda: len(server.manager.sessions[c.session_id].viewers.spectators) == 1,
                        "the fMP4 spectator released")
            assert (await players[3].play(http, vb["whep_url"], vb["viewer_token"])).status_code == 201
        finally:
            if fmp4 is not None:
                await fmp4.aclose(delete=False)
            for p in players:
                await p.close()
            await http.delete(f"/v1/sessions/{b['session_id']}", headers=auth(b["token"]))


async def test_a_burst_of_offers_admits_the_cap_and_refuses_the_rest_holding_nothing(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=16)) as http, \
            await StreamClient.connect(server.url, seed=6) as c:
        v = await viewer(http, c.session_id, c.token)
        p = Player()
        offer = await p.offer()
        await p.close()
        headers = SDP | auth(v["viewer_token"])
        replies = await asyncio.gather(*(http.post(v["whep_url"], content=offer, headers=headers) for _ in range(100)))
        statuses = sorted(r.status_code for r in replies)
        assert statuses.count(201) == VIEWERS.max_spectators_per_session and statuses.count(429) == 98, statuses
        session = server.manager.sessions[c.session_id]
        assert len(session.viewers.spectators) == 2 and len(server.app.state.whep.peers) == 2
        for r in replies:
            if r.status_code == 201:
                assert (await http.delete(r.headers["location"], headers=auth(v["viewer_token"]))).status_code == 200
        assert not session.viewers.spectators and not server.app.state.whep.peers
        assert len(session.frames.sinks) == 1
        await c.next_frame()
        assert c.closed_code is None


async def test_whep_answers_carry_cors_for_players_on_other_origins(server: LiveServer) -> None:
    origin = {"Origin": "http://player.example"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        url = "/v1/sessions/0123456789abcdef/whep"
        r = await http.options(url, headers=origin | {"Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "authorization,content-type"})
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "*"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert {"authorization", "content-type"} <= {h.strip().lower() for h in
                                                     r.headers["access-control-allow-headers"].split(",")}
        for resp in (await http.post(url, content="v=0", headers=origin | SDP),  # 401, from the route
                     await http.post(url, content="{}", headers=origin | {"Content-Type": "application/json"})):  # 415
            assert resp.status_code in (401, 415) and resp.headers["access-control-allow-origin"] == "*"
            assert "Location" in resp.headers["access-control-expose-headers"]
        assert "access-control-allow-origin" not in (await http.get("/healthz", headers=origin)).headers
