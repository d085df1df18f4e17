"""Real aiortc client peers against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from worldcast.transport.clients.errors import RpcFailed
from worldcast.transport.clients.webrtc import WebRTCClient

pytestmark = pytest.mark.timeout(180)


async def frames_for(c: WebRTCClient, seconds: float) -> list:  # type: ignore[type-arg]
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(await c.next_frame())
    return out


async def test_video_flows_with_increasing_pts_and_metadata(live_server) -> None:  # type: ignore[no-untyped-def]
    async with await WebRTCClient.connect(live_server.url, seed=1) as c:
        first = await c.next_frame()  # time to first frame is the benchmark's to measure, not a test's
        scale = live_server.config.video_scale
        assert (first.width, first.height) == (64 * scale, 64 * scale)
        frames = await frames_for(c, 2.0)
        pts = [first.pts] + [f.pts for f in frames]
        assert all(b > a for a, b in zip(pts, pts[1:])), pts
        assert frames[-1].time_base.denominator == 90_000
        ev = await c.wait_event(lambda m: m.get("event") == "frame")
        assert {"frame_index", "pts", "action_seq", "epoch", "lateness_ms", "timings_ms"} <= set(ev)
        assert set(ev["timings_ms"]) == {"queue", "denoise", "decode"}  # the commit forward follows publication


async def test_pressed_key_is_applied_and_picture_moves(live_server) -> None:  # type: ignore[no-untyped-def]
    # the default world (the meadow), as a new user first sees it
    async with await WebRTCClient.connect(live_server.url, seed=2) as c:
        await c.next_frame()
        seq = -1
        for _ in range(15):  # hold D for a while
            seq = c.send_action(keys=["d"])
            await asyncio.sleep(0.03)
        ev = await c.wait_event(lambda m: m.get("event") == "frame" and m["action_seq"] >= seq, timeout_s=10)
        assert ev["action_seq"] >= seq
        # the video now shows the camera moving right: content shifts left frame to frame
        a = (await c.next_frame()).to_ndarray(format="rgb24").astype(np.float32)
        frames = [await c.next_frame() for _ in range(4)]
        b = frames[-1].to_ndarray(format="rgb24").astype(np.float32)
        assert estimate_dx(a, b) < 0
        c.send_action(keys=[])


def estimate_dx(a: np.ndarray, b: np.ndarray, max_shift: int = 24) -> int:
    """Horizontal shift of b relative to a (negative: content moved left), by least squares."""
    ga, gb = a.mean(-1), b.mean(-1)
    h, w = ga.shape
    band = np.r_[0 : h // 2 - 8, h // 2 + 8 : h]  # skip the player marker in the middle
    best, best_dx = np.inf, 0
    for dx in range(-max_shift, max_shift + 1):
        sa = ga[band][:, max(0, -dx) : w - max(0, dx)]
        sb = gb[band][:, max(0, dx) : w - max(0, -dx)]
        err = float(((sa - sb) ** 2).mean())
        if err < best:
            best, best_dx = err, dx
    return best_dx


async def test_flush_drops_stale_frames(live_server) -> None:  # type: ignore[no-untyped-def]
    async with await WebRTCClient.connect(live_server.url, seed=3) as c:
        await c.next_frame()
        c.send_action(keys=["w"])
        epoch = (await c.rpc("flush"))["epoch"]
        assert epoch == 1
        acked = len(c.frame_events)
        await c.wait_event(lambda m: m.get("event") == "frame" and m["epoch"] >= epoch)
        later = list(c.frame_events)[acked:]
        assert later and all(e["epoch"] >= epoch for e in later)


async def test_cancel_stops_frames_until_resume(live_server) -> None:  # type: ignore[no-untyped-def]
    """Proven by events: while another session on the same engine gets 10 frames (the engine is running,
    however busy the machine), the cancelled one gets none; after resume it gets frames of the new epoch."""
    async with await WebRTCClient.connect(live_server.url, seed=4) as c, \
            await WebRTCClient.connect(live_server.url, seed=40) as clock:
        await c.next_frame()
        await clock.next_frame()
        epoch = (await c.rpc("cancel"))["epoch"]
        n, m = len(c.frame_events), len(clock.frame_events)
        for _ in range(10):
            await clock.wait_event(lambda e: e.get("event") == "frame")
        assert len(clock.frame_events) >= m + 10
        assert list(c.frame_events)[n:] == [], "frames after cancel"
        await c.rpc("resume")
        ev = await c.wait_event(lambda e: e.get("event") == "frame")
        assert ev["epoch"] == epoch


async def test_bad_input_is_rejected_precisely_while_another_session_streams(live_server) -> None:  # type: ignore[no-untyped-def]
    async with await WebRTCClient.connect(live_server.url, seed=5) as bad, \
            await WebRTCClient.connect(live_server.url, seed=6) as other:
        await bad.next_frame()
        await other.next_frame()
        before = len(other.frame_events)
        cases = [
            ("{not json", -32700, "not valid JSON"),
            (json.dumps({"seq": 1, "t": 0, "keys": ["fly"]}), -32602, "unknown key"),
            (json.dumps({"seq": "1", "t": 0}), -32602, "seq"),
            (json.dumps({"seq": 1, "t": 0, "mouse": [1]}), -32602, "mouse"),
            (json.dumps({"seq": 1, "t": 0, "extra": 1}), -32602, "extra"),
            (json.dumps({"seq": 1, "t": 0, "keys": ["w"] * 3000}), -32600, "exceeds"),
        ]
        for payload, code, needle in cases:
            bad.send_raw_action(payload)
            ev = await bad.wait_event(lambda m: m.get("event") == "action_rejected")
            assert ev["code"] == code and needle in ev["message"], (payload[:40], ev)
        for raw, code, needle in [
            ({"id": 1, "method": "warp"}, -32601, "unknown method"),
            ({"id": 2, "method": "set_prompt", "params": {"prompt": 5}}, -32602, "prompt"),
            ({"id": 3, "method": "flush", "params": []}, -32600, "params"),
        ]:
            reply = await bad.rpc("", raw=raw)
            assert reply["error"]["code"] == code and needle in reply["error"]["message"]
        with pytest.raises(RpcFailed) as e:
            await bad.rpc("pause", {"hard": True})
        assert e.value.code == -32602
        state = await bad.rpc("get_state")
        assert state["epoch"] == 0 and not state["paused"] and state["last_action_seq"] == -1
        await bad.wait_event(lambda m: m.get("event") == "frame")  # the bad session itself still streams
        await other.wait_event(lambda m: m.get("event") == "frame")
        assert len(other.frame_events) > before


async def test_prompt_change_then_flush_changes_the_world(live_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.models.tinyworld import world

    cents = world.theme_centroids()
    async with await WebRTCClient.connect(live_server.url, prompt="a green meadow", seed=7) as c:
        f = (await c.next_frame()).to_ndarray(format="rgb24")
        assert world.THEMES[world.classify_theme(f, cents)] == "meadow"
        await c.rpc("set_prompt", {"prompt": "rivers of glowing molten lava"})
        epoch = (await c.rpc("flush"))["epoch"]
        ev = await c.wait_event(lambda m: m.get("event") == "frame" and m["epoch"] >= epoch)
        themes = []
        for _ in range(6):
            fr = await c.next_frame()
            if fr.pts >= ev["pts"]:
                themes.append(world.THEMES[world.classify_theme(fr.to_ndarray(format="rgb24"), cents)])
        assert themes and themes.count("lava") >= len(themes) - 1, themes


async def test_hostile_data_channel_messages_keep_the_connection(live_server) -> None:  # type: ignore[no-untyped-def]
    async with await WebRTCClient.connect(live_server.url, seed=8) as c:
        await c.next_frame()
        deep = "[" * 1000 + "]" * 1000  # under the size limit, deeper than the JSON parser's recursion
        c.send_raw_action(deep)
        ev = await c.wait_event(lambda m: m.get("event") == "action_rejected")
        assert ev["code"] == -32700 and "nested" in ev["message"]
        reply = await c.rpc("", raw=deep)
        assert reply["error"]["code"] == -32700
        # a flood of control messages is rate-limited, not queued without bound; every call still ends
        # (answered, or named in an rpc_rejected summary past the reply budget)
        replies = await asyncio.gather(*(c.rpc("", raw={"id": 1000 + i, "method": "get_state"}) for i in range(60)))
        limited = [r for r in replies if r.get("error", {}).get("code") == -32001]
        assert 0 < len(limited) < 60
        t0 = time.monotonic()
        while True:  # the bucket refills at 10/s: calls succeed again
            try:
                assert (await c.rpc("get_state"))["epoch"] == 0
                break
            except RpcFailed as e:
                assert e.code == -32001 and time.monotonic() - t0 < 30
                await c.wait_event(lambda m: m.get("event") == "frame")  # pace the retries by frames
        assert c.pc.connectionState == "connected"
        await c.next_frame()


async def test_a_bad_second_offer_leaves_the_live_peer_alone(live_server) -> None:  # type: ignore[no-untyped-def]
    async with await WebRTCClient.connect(live_server.url, seed=9) as c:
        await c.next_frame()
        url = f"/v1/sessions/{c.session_id}/webrtc"
        r = await c.http.post(url, json={"sdp": "v=0\r\ngarbage", "type": "offer"})
        assert r.status_code == 400 and "invalid SDP offer: line 2" in r.json()["detail"]
        n = len(c.frame_events)
        await c.wait_event(lambda m: m.get("event") == "frame")
        assert len(c.frame_events) > n and c.pc.connectionState == "connected"
        info = (await c.http.get(f"/v1/sessions/{c.session_id}")).json()
        assert info["sinks"] == 1
