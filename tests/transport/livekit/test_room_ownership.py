"""A LiveKit room belongs to its session (issue 31, item 2), against a real livekit-server.

A create never joins a room another session holds or one that exists on the LiveKit server, unless the
request carries the admin token; a create naming no room gets a fresh room named by the server. The
session's own client (`LiveKitUser`) takes events and frame metadata only from the world's participant:
another participant in the room publishing on those topics is ignored.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import LiveServer, _serve, server_config
from tests.transport.livekit.conftest import livekit_config

pytestmark = pytest.mark.timeout(180)
lk = pytest.importorskip("livekit.rtc")

ADMIN = "room-admin-token-0123456789"


@pytest.fixture(scope="module")
def server(model, livekit_server) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    yield from _serve(server_config(livekit=livekit_config(livekit_server), admin_token=ADMIN), model)


async def test_a_create_never_takes_another_sessions_room_or_an_existing_one(server, livekit_server) -> None:  # type: ignore[no-untyped-def]
    from livekit import api

    from worldcast.transport.clients.livekit import LiveKitUser

    victim = await LiveKitUser.create(server.url, room="victim-room", seed=1)
    try:
        await victim.next_frame(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            before = set(server.manager.sessions)
            # 1. another session's room: 409 with the reason, no session kept, the victim untouched
            r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "victim-room"})
            assert r.status_code == 409 and "belongs to another session" in r.json()["detail"], r.text
            # a token that is not the admin token proves nothing
            r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "victim-room"},
                                headers={"Authorization": f"Bearer {victim.token}"})
            assert r.status_code == 409, r.text
            # 2. a room that exists on the LiveKit server (someone else's call, no worldcast session in it)
            async with api.LiveKitAPI(livekit_server.url.replace("ws", "http", 1), livekit_server.api_key,
                                      livekit_server.api_secret) as svc:
                await svc.room.create_room(api.CreateRoomRequest(name="their-call", empty_timeout=120))
            r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "their-call"})
            assert r.status_code == 409 and "already exists on the LiveKit server" in r.json()["detail"], r.text
            assert set(server.manager.sessions) == before and victim.session_id in server.manager.sessions
            assert victim.session_id == server.app.state.livekit.owner_of("victim-room")
            # 3. the operator may join an existing room
            r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "their-call"},
                                headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 201, r.text
            op = r.json()
            # 4. no room named: the server names a fresh one, different each time
            a = (await http.post("/v1/sessions", json={"transport": "livekit"})).json()
            b = (await http.post("/v1/sessions", json={"transport": "livekit"})).json()
            assert a["livekit"]["room"].startswith("worldcast-room-") and a["livekit"]["room"] != b["livekit"]["room"]
            # 5. a new room named by the caller is still fine
            r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "fresh-room-5"})
            assert r.status_code == 201, r.text
            for s in (op, a, b, r.json()):
                await http.delete(f"/v1/sessions/{s['session_id']}", headers={"Authorization": f"Bearer {s['token']}"})
        f = await victim.next_frame(30)  # still streaming
        assert f.width > 0
    finally:
        await victim.aclose()


async def test_the_user_takes_events_and_frame_metadata_only_from_its_world(server, livekit_server) -> None:  # type: ignore[no-untyped-def]
    from livekit import api, rtc

    from worldcast.transport.clients.livekit import LiveKitUser

    u = await LiveKitUser.create(server.url, room="spoof-room", seed=2)
    intruder = rtc.Room()
    try:
        await u.next_frame(30)
        # someone else in the room (a token of its own: how it got in does not matter to the client)
        tok = (api.AccessToken(livekit_server.api_key, livekit_server.api_secret).with_identity("intruder")
               .with_grants(api.VideoGrants(room_join=True, room="spoof-room", can_publish_data=True)).to_jwt())
        await intruder.connect(livekit_server.url, tok)
        fake_event = {"event": "error", "code": "session_failed", "spoofed": True}
        fake_frame = {"frame_index": 10**9, "pts": 1, "action_seq": 10**9, "spoofed": True}
        for _ in range(5):
            await intruder.local_participant.publish_data(json.dumps(fake_event), reliable=True, topic="events")
            await intruder.local_participant.publish_data(json.dumps(fake_frame), reliable=True, topic="frames")
            await asyncio.sleep(0.1)
        n = len(u.frame_events)
        t0 = time.monotonic()
        while len(u.frame_events) < n + 5:  # the world's own metadata keeps arriving meanwhile
            assert time.monotonic() - t0 < 30, "no frame metadata from the world"
            await asyncio.sleep(0.05)
        assert not any(e.get("spoofed") for e in list(u.events) + list(u.frame_events)), "took a spoofed message"
        assert u.session_id in server.manager.sessions
    finally:
        await intruder.disconnect()
        await u.aclose()
