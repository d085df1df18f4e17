"""LiveKit room join, end to end: a real livekit-server, the server's world participant, and the
Python `livekit` SDK as the session's user (and as a stranger in the room)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import numpy as np
import pytest

from tests.transport.test_webrtc_session import estimate_dx

pytestmark = pytest.mark.timeout(180)

lk = pytest.importorskip("livekit.rtc")


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    """Wait for `cond` (polled every 20 ms), failing with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.02)


def stamps(frames):  # type: ignore[no-untyped-def]
    from worldcast.transport.media.stamp import cell_px_for_width, read_stamp

    return [read_stamp(f.image, cell_px=cell_px_for_width(f.width)) for f in frames]


async def stranger(livekit_server, room: str):  # type: ignore[no-untyped-def]
    """Another participant in the room, with a token of its own (may publish data)."""
    from livekit import api, rtc

    tok = (api.AccessToken(livekit_server.api_key, livekit_server.api_secret).with_identity("stranger")
           .with_grants(api.VideoGrants(room_join=True, room=room, can_update_own_metadata=True)).to_jwt())
    r = rtc.Room()
    await r.connect(livekit_server.url, tok)
    await r.local_participant.set_attributes({"x": "1"})  # announce at once (see world.py)
    return r


async def test_join_stream_act_and_leave(lk_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.clients.livekit import LiveKitUser

    manager = lk_server.manager
    free_before = manager.engines[0].worker.pool.free_slots
    # the default world (the meadow), as a new user first sees it
    u = await LiveKitUser.create(lk_server.url, room="join-1", seed=2, stamp_frames=True)
    try:
        sid = u.session_id
        assert sid in manager.sessions and u.world_identity == f"worldcast-{sid}"
        scale = lk_server.config.video_scale
        first = await u.next_frame(20)
        assert (first.width, first.height) == (64 * scale, 64 * scale)
        frames = [await u.next_frame() for _ in range(3)]
        pts = [f.pts for f in frames]
        assert all(b > a for a, b in zip(pts, pts[1:])), pts
        read = [s for s in stamps(frames) if s is not None]
        assert read and read[-1].action_seq == -1  # nothing pressed yet
        assert u.frame_events, "no frame metadata on the frames topic"
        assert {"frame_index", "pts", "action_seq", "epoch", "lateness_ms", "timings_ms"} <= set(u.frame_events[-1])

        # hold D: the stamped action seq advances with it and the camera moves right
        seq = u.send_action(keys=["d"])
        deadline = time.monotonic() + 15
        while True:  # the first frame showing it
            assert time.monotonic() < deadline, f"action {seq} never applied"
            a_frame = await u.next_frame()
            s = stamps([a_frame])[0]
            if s is not None and s.action_seq >= seq:
                break
        def textured(frame) -> bool:  # type: ignore[no-untyped-def]
            g = frame.image[:-16].mean(-1)  # above the stamp band
            return float(g.std()) >= 3.0  # a flat view (open water, sky) shows no shift either way

        held, flat = {}, 0  # by stamped frame index: a busy receiver may hand a frame over twice
        f = a_frame
        while True:
            st = stamps([f])[0]
            if st is not None and st.frame_index not in held:
                if textured(f):
                    held[st.frame_index] = f
                else:
                    flat += 1
            if len(held) >= 12:
                break
            assert time.monotonic() < deadline + 45, f"only {len(held)} textured frames ({flat} flat) holding D"
            seq = u.send_action(keys=["d"])
            f = await u.next_frame()
        order = sorted(held)
        sizes = {(held[i].width, held[i].height) for i in order}
        assert sizes == {(64 * scale, 64 * scale)}, f"the SDK changed the resolution: {sizes}"
        images = {i: held[i].image.astype(np.float32) for i in order}
        for im in images.values():
            im[-16:] = 0  # blank the stamp band (8 px at this width): it does not move
        # content shifts left from frame to frame (pairs 4-6 frames apart)
        dxs = [estimate_dx(images[a], images[b]) for a in order for b in order if 4 <= b - a <= 6]
        assert dxs, f"no pairs 4-6 frames apart among {order}"
        assert sum(d < 0 for d in dxs) > sum(d > 0 for d in dxs), (dxs, order, flat)
        applied = -1
        while applied < seq:
            assert time.monotonic() < deadline, f"action {seq} never applied (last {applied})"
            s = stamps([await u.next_frame()])[0]
            applied = s.action_seq if s is not None else applied
        assert manager.sessions[sid].inputs.actions.last_seq == seq
    finally:
        await u.aclose()
    # leaving closes the session and frees its slot
    await until(lambda: sid not in manager.sessions, "session closed after the user left")
    await until(lambda: manager.engines[0].worker.pool.free_slots == free_before, "KV slot freed")


async def test_each_rpc_has_its_effect(lk_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.models.tinyworld import world
    from worldcast.transport.clients.livekit import LiveKitUser

    cents = world.theme_centroids()
    async with await LiveKitUser.create(lk_server.url, room="rpc-1", prompt="a green meadow", seed=3) as u:
        await u.next_frame(20)
        first = [world.THEMES[world.classify_theme((await u.next_frame()).image, cents)] for _ in range(3)]
        assert first.count("meadow") >= 2, first  # (a decoder's first picture can be off)
        state = await u.rpc("get_state")
        assert state["session_id"] == u.session_id and state["epoch"] == 0 and state["sinks"] == 1

        # set_prompt + flush: no frame of an older epoch after the flush reply, and the world changes
        assert await u.rpc("set_prompt", {"prompt": "rivers of glowing molten lava"}) == {
            "prompt": "rivers of glowing molten lava"}
        u.send_action(keys=["w"])
        epoch = (await u.rpc("flush"))["epoch"]
        replied_at = time.monotonic()
        assert epoch == 1
        await until(lambda: sum(e["received_at"] > replied_at for e in u.frame_events) >= 5, "frames after flush")
        after = [e["epoch"] for e in u.frame_events if e["received_at"] > replied_at]
        assert min(after) >= epoch, after
        themes = []
        for _ in range(8):
            fr = await u.next_frame()
            themes.append(world.THEMES[world.classify_theme(fr.image, cents)])
        assert themes[-3:].count("lava") >= 2, themes

        # pause: generation stops (no new frame events); resume: it restarts
        assert await u.rpc("pause") == {}
        assert (await u.rpc("get_state"))["paused"] is True
        await asyncio.sleep(0.3)  # let frames generated before the pause drain
        n = len(u.frame_events)
        await asyncio.sleep(0.5)  # window in which no frame may arrive
        assert len(u.frame_events) == n
        assert await u.rpc("resume") == {}
        await u.wait_event(lambda m: m.get("event") == "frame")

        # cancel: a new epoch, nothing until resume
        epoch = (await u.rpc("cancel"))["epoch"]
        assert epoch == 2 and (await u.rpc("get_state"))["cancelled"] is True
        n = len(u.frame_events)
        await asyncio.sleep(0.5)  # window in which no frame may arrive
        assert len(u.frame_events) == n
        await u.rpc("resume")
        ev = await u.wait_event(lambda m: m.get("event") == "frame")
        assert ev["epoch"] == epoch


async def test_bad_input_is_refused_and_the_session_keeps_streaming(lk_server, livekit_server) -> None:  # type: ignore[no-untyped-def]
    from livekit import rtc

    from worldcast.transport.clients.livekit import LiveKitUser

    async with await LiveKitUser.create(lk_server.url, room="bad-1", seed=4) as u, \
            await LiveKitUser.create(lk_server.url, room="bad-2", seed=5) as other:
        await u.next_frame(20)
        await other.next_frame(20)
        world = lk_server.app.state.livekit.worlds[u.session_id]

        # malformed, oversized and schema-breaking action packets: an action_rejected event each
        cases = [
            ("{not json", -32700, "not valid JSON"),
            (json.dumps({"seq": 1, "t": 0, "keys": ["w"] * 3000}), -32600, "exceeds"),
            (json.dumps({"seq": 1, "t": 0, "keys": ["fly"]}), -32602, "unknown key"),
            (json.dumps({"seq": "1", "t": 0}), -32602, "seq"),
            (json.dumps({"seq": 1, "t": 0, "extra": 1}), -32602, "extra"),
            ("[" * 1000 + "]" * 1000, -32700, "nested"),
        ]
        for payload, code, needle in cases:
            u.send_raw(payload)
            ev = await u.wait_event(lambda m: m.get("event") == "action_rejected")
            assert ev["code"] == code and needle in ev["message"], (payload[:40], ev)

        # a packet on another topic: dropped and logged, nothing applied
        u.send_raw(json.dumps({"seq": 5, "t": 0, "keys": ["w"]}), topic="chat")
        await until(lambda: world.dropped["topic"] == 1, "wrong-topic packet dropped")

        # a stranger in the room: its actions are dropped, its RPCs refused with 1522
        s = await stranger(livekit_server, "bad-1")
        try:
            await until(lambda: "stranger" in world.room.remote_participants, "world sees the stranger")
            await s.local_participant.publish_data(json.dumps({"seq": 9, "t": 0, "keys": ["w"]}), topic="actions",
                                                   destination_identities=[world.identity])
            await until(lambda: world.dropped["sender"] == 1, "stranger's action dropped")
            with pytest.raises(rtc.RpcError) as e:
                await s.local_participant.perform_rpc(destination_identity=world.identity, method="flush",
                                                      payload="{}")
            assert e.value.code == 1522
        finally:
            await s.disconnect()

        # RPCs with bad payloads: LiveKit errors in the application range, JSON-RPC code in data
        for method, payload, code, inner, needle in [
            ("set_prompt", json.dumps({"prompt": 5}), 1512, -32602, "prompt"),
            ("set_prompt", "{not json", 1510, -32700, "not valid JSON"),
            ("flush", "[]", 1511, -32600, "params"),
            ("pause", json.dumps({"hard": True}), 1512, -32602, "hard"),
            ("set_prompt", json.dumps({"prompt": "x" * 5000}), 1511, -32600, "exceeds"),
        ]:
            with pytest.raises(rtc.RpcError) as e:
                await u.rpc(method, payload=payload)
            assert e.value.code == code and needle in e.value.message, (method, payload[:30], e.value.message)
            assert json.loads(e.value.data) == {"code": inner}
        with pytest.raises(rtc.RpcError) as e:
            await u.rpc("warp")
        assert e.value.code == rtc.RpcError.ErrorCode.UNSUPPORTED_METHOD

        # nothing of it changed the session; both sessions still stream
        state = await u.rpc("get_state")
        assert state["epoch"] == 0 and not state["paused"] and state["last_action_seq"] == -1
        n, m = len(u.frame_events), len(other.frame_events)
        await u.wait_event(lambda x: x.get("event") == "frame")
        await until(lambda: len(other.frame_events) > m and len(u.frame_events) > n, "both sessions stream")
        await u.next_frame()


async def test_delete_makes_the_world_leave(lk_server) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from worldcast.transport.clients.livekit import LiveKitUser

    async with await LiveKitUser.create(lk_server.url, room="del-1", seed=6) as u:
        await u.next_frame(20)
        world = u.world_identity
        async with httpx.AsyncClient(base_url=lk_server.url) as http:
            r = await http.delete(f"/v1/sessions/{u.session_id}", headers={"Authorization": f"Bearer {u.token}"})
        assert r.status_code == 204
        await until(lambda: world not in u.room.remote_participants, "world left the room")
        assert u.session_id not in lk_server.app.state.livekit.worlds


async def test_livekit_requests_are_validated(live_server) -> None:  # type: ignore[no-untyped-def]
    import httpx

    async with httpx.AsyncClient(base_url=live_server.url) as http:
        r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "r"})
        assert r.status_code == 400 and "--livekit-url" in r.json()["detail"]  # this server has no LiveKit
        r = await http.post("/v1/sessions", json={"transport": "livekit"})  # no room: the server would name one
        assert r.status_code == 400 and "--livekit-url" in r.json()["detail"]
        r = await http.post("/v1/sessions", json={"room": "r"})
        assert r.status_code == 422 and "only for transport" in r.json()["detail"]
        r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "a b/../c"})
        assert r.status_code == 422 and "room" in r.json()["detail"]
        r = await http.post("/v1/sessions", json={"transport": "carrier-pigeon"})
        assert r.status_code == 422
    assert not live_server.manager.sessions
