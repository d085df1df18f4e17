"""LiveKit spectators: a viewer token's subscribe-only LiveKit token (claims decoded), and, against a real
livekit-server, a viewer who joins the session's room hidden, watches the world's track, can neither act nor
be taken for the user, and is removed from the room when its viewer token is revoked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.timeout(180)

lk = pytest.importorskip("livekit.rtc")

SECRET = "s" * 32


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.02)


def test_a_viewers_livekit_token_only_joins_hidden_and_subscribes() -> None:
    import jwt
    from livekit import api

    from worldcast.transport.livekit.config import LiveKitConfig
    from worldcast.transport.livekit.tokens import viewer_identity, viewer_token

    cfg = LiveKitConfig(url="ws://127.0.0.1:7880", api_key="key", api_secret=SECRET)
    identity = viewer_identity("sid", "v123")
    tok = viewer_token(cfg, room="r1", identity=identity, ttl_s=42.0)
    claims = api.TokenVerifier("key", SECRET).verify(tok)
    g = claims.video
    assert claims.identity == "viewer-sid-v123" and g.room == "r1" and g.room_join and g.hidden
    assert g.can_subscribe and not g.can_publish and not g.can_publish_data and not g.can_update_own_metadata
    assert not g.room_admin and not g.room_create and not g.agent
    c = jwt.decode(tok, SECRET, algorithms=["HS256"])
    assert abs((c["exp"] - c["nbf"]) - 42) <= 1
    with pytest.raises(ValueError, match="at least 1 s"):
        viewer_token(cfg, room="r1", identity=identity, ttl_s=0.5)


class Viewer:
    """A viewer in the room: joins with the viewer's LiveKit token, keeps the world's video frames."""

    def __init__(self) -> None:
        self.room = lk.Room()
        self.frames = 0
        self.disconnected = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.room.on("track_subscribed", self._on_track)
        self.room.on("disconnected", lambda *a: self.disconnected.set())

    def _on_track(self, track: Any, pub: Any, p: Any) -> None:
        if track.kind == lk.TrackKind.KIND_VIDEO:
            self._tasks.append(asyncio.get_running_loop().create_task(self._read(track)))

    async def _read(self, track: Any) -> None:
        async for _ in lk.VideoStream(track, capacity=2):
            self.frames += 1

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await self.room.disconnect()


async def test_a_livekit_viewer_watches_hidden_cannot_act_and_is_removed_on_revoke(lk_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.clients.livekit import LiveKitUser

    u = await LiveKitUser.create(lk_server.url, seed=3)
    viewer = Viewer()
    try:
        sid = u.session_id
        await u.next_frame(20)
        async with httpx.AsyncClient(base_url=lk_server.url, timeout=30) as http:
            r = await http.post(f"/v1/sessions/{sid}/viewers", headers={"Authorization": f"Bearer {u.token}"})
            assert r.status_code == 201, r.text
            v = r.json()
            access = v["livekit"]
            world = lk_server.app.state.livekit.worlds[sid]
            assert access["room"] == world.room_name and access["identity"] == f"viewer-{sid}-{v['viewer_id']}"
            assert access["world_identity"] == world.identity and 0 < access["token_ttl_s"] <= 300
            await viewer.room.connect(access["url"], access["token"], lk.RoomOptions(auto_subscribe=True))
            await until(lambda: viewer.frames >= 3, "the viewer receiving the world's video", 20)
            assert world.user_identity == f"user-{sid}"  # never taken for the user
            assert access["identity"] not in world.room.remote_participants  # hidden: the world never sees it
            assert access["identity"] not in u.room.remote_participants
            # it can publish no data: refused by the SFU, or at the least never reaching the world
            before, dropped = lk_server.manager.sessions[sid].inputs.actions.last_seq, dict(world.dropped)
            with contextlib.suppress(Exception):  # the SDK may refuse at once, or the SFU drop it
                await viewer.room.local_participant.publish_data(
                    json.dumps({"seq": 99, "t": 0, "keys": ["d"], "mouse": [0, 0]}), reliable=True,
                    topic="actions", destination_identities=[world.identity])
            seq = u.send_action(keys=["w"])  # the user still acts
            await u.wait_event(lambda e: e.get("action_seq", -1) >= seq, timeout_s=15)
            assert lk_server.manager.sessions[sid].inputs.actions.last_seq == seq != 99
            assert before != 99 and world.dropped["sender"] == dropped["sender"]
            r = await http.delete(f"/v1/sessions/{sid}/viewers/{v['viewer_id']}",
                                  headers={"Authorization": f"Bearer {u.token}"})
            assert r.status_code == 204
            await asyncio.wait_for(viewer.disconnected.wait(), 15)  # removed through the room service
            assert (access["identity"], "viewer revoked") in world.removed
            await u.next_frame()
    finally:
        await viewer.aclose()
        await u.aclose(delete=True)


async def test_a_session_not_in_a_room_has_no_livekit_access(lk_server) -> None:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=lk_server.url, timeout=30) as http:
        s = (await http.post("/v1/sessions", json={})).json()
        h = {"Authorization": f"Bearer {s['token']}"}
        r = await http.post(f"/v1/sessions/{s['session_id']}/viewers", headers=h)
        assert r.status_code == 201 and r.json()["livekit"] is None
        await http.delete(f"/v1/sessions/{s['session_id']}", headers=h)
