"""The WebSocket stream against a real server on loopback: fMP4 out, actions and RPCs in, auth, bad input."""

from __future__ import annotations

import asyncio
import io
import json
import socket

import av
import httpx
import pytest
from websockets.asyncio.client import connect

from worldcast.transport.clients import StreamClient, StreamError
from worldcast.transport.stream.mp4box import parse_init, sps_from_avcc

pytestmark = pytest.mark.timeout(180)


def ws_url(base: str, sid: str, query: str = "") -> str:
    return "ws" + base.removeprefix("http") + f"/v1/sessions/{sid}/stream" + query


async def until_gone(streams: dict, sid: str, timeout_s: float = 10.0) -> None:  # type: ignore[type-arg]
    for _ in range(int(timeout_s / 0.01)):
        if sid not in streams:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"stream of {sid} still registered after {timeout_s} s")


def small_buffer_socket(url: str) -> socket.socket:
    """A connected, non-blocking TCP socket to `url` with a 4 KiB receive buffer (a slow link's)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    return sock


async def create(url: str, **body) -> dict:  # type: ignore[no-untyped-def, type-arg]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/v1/sessions", json=body)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


async def test_stream_decodes_with_pyav_with_increasing_timestamps_and_the_sps_codec(live_server) -> None:  # type: ignore[no-untyped-def]
    rec = io.BytesIO()
    async with await StreamClient.connect(live_server.url, seed=1, record=rec) as c:
        frames = [await c.next_frame() for _ in range(30)]
        kinds = [e["event"] for e in c.events if e["event"] != "state"]
        assert kinds[:3] == ["stream_start", "media_init", "media"] and set(kinds[3:]) == {"media"}
        init = next(e for e in c.events if e["event"] == "media_init")
        assert init["mime"] == f'video/mp4; codecs="{init["codec"]}"'
        scale = live_server.config.video_scale
        assert (frames[0].frame.width, frames[0].frame.height) == (64 * scale, 64 * scale)
        assert frames[0].keyframe
        idx = [f.frame_index for f in frames]
        assert idx == sorted(set(idx)), "frame indices strictly increase"
        assert all(b.pts > a.pts for a, b in zip(frames, frames[1:]))
        n_media = c.media_segments
    data = rec.getvalue()
    info = parse_init(data)
    assert info.movie_duration == 0 and not info.has_mehd
    assert init["codec"] == "avc1." + sps_from_avcc(info.avcc).hex()[2:8].upper()  # type: ignore[arg-type]
    with av.open(io.BytesIO(data)) as f:
        st = f.streams.video[0]
        decoded = list(f.decode(st))
        assert st.codec_context.extradata[1:4].hex().upper() == init["codec"][5:]
    assert len(decoded) == n_media >= 30
    ts = [d.pts for d in decoded]
    assert all(b > a for a, b in zip(ts, ts[1:])), "strictly increasing timestamps"


async def test_actions_and_rpcs_share_the_data_channels_parsers(live_server) -> None:  # type: ignore[no-untyped-def]
    async with await StreamClient.connect(live_server.url, seed=2) as c:
        await c.next_frame()
        seq = -1
        for _ in range(10):
            seq = await c.send_action(keys=["d"])
            await asyncio.sleep(0.03)
        ev = await c.wait_event(lambda e: e["event"] == "media" and e["action_seq"] >= seq, timeout_s=15)
        assert ev["action_seq"] >= seq
        epoch = (await c.rpc("flush"))["epoch"]
        assert epoch == 1
        f = await c.next_frame()
        while f.epoch < epoch:
            f = await c.next_frame()
        assert f.keyframe, "the first frame after a flush is an IDR"
        state = await c.rpc("get_state")
        assert state["last_action_seq"] == seq and state["mode"] == "interactive"
        with pytest.raises(StreamError) as e:
            await c.rpc("warp")
        assert e.value.code == -32601
        # the data channel's own rejections, unchanged
        await c.send_raw(json.dumps({"seq": seq + 1, "t": 0, "keys": ["fly"]}))
        rej = await c.wait_event(lambda e: e["event"] == "action_rejected")
        assert rej["code"] == -32602 and "fly" in rej["message"]


@pytest.mark.parametrize("payload,code,needle", [
    ("{not json", "bad_json", "not valid JSON"),
    ("[1, 2]", "bad_message", "JSON object"),
    (json.dumps({"type": "teleport"}), "unknown_type", "teleport"),
    (json.dumps({"type": 7}), "unknown_type", "int"),
    (json.dumps({"hello": 1}), "bad_message", "expected an action"),
    (json.dumps({"type": "direction", "id": "x", "prompt": "a field"}), "not_directing", "interactive"),
    (json.dumps({"type": "auth", "token": "again"}), "already_authenticated", "already"),
    ("x" * 5000, "message_too_large", "5000 bytes"),
    (b"\x00\x01binary", "binary_not_accepted", "binary"),
])
async def test_bad_input_gets_a_precise_error_and_the_stream_goes_on(live_server, payload, code, needle) -> None:  # type: ignore[no-untyped-def]
    async with await StreamClient.connect(live_server.url, seed=3) as c, \
            await StreamClient.connect(live_server.url, seed=4) as other:
        await c.next_frame()
        await other.next_frame()
        await c.send_raw(payload)
        err = await c.wait_event(lambda e: e["event"] == "error")
        assert err["code"] == code and needle in err["message"], err
        await c.wait_event(lambda e: e["event"] == "media")  # both streams go on after the bad message
        await other.wait_event(lambda e: e["event"] == "media")
        assert c.closed_code is None and other.closed_code is None
        assert (await c.rpc("get_state"))["state"] == "active"
        assert not [e for e in other.events if e["event"] == "error"], "the other session never noticed"


async def test_auth_by_header_or_first_message_never_by_url(live_server) -> None:  # type: ignore[no-untyped-def]
    s = await create(live_server.url, seed=4)
    sid, tok = s["session_id"], s["token"]

    async def refused(url: str, headers: dict[str, str] | None = None, first: str | None = None) -> tuple[dict, int]:  # type: ignore[type-arg]
        async with connect(url, additional_headers=headers or {}, compression=None) as ws:
            if first is not None:
                await ws.send(first)
            err = json.loads(await ws.recv())
            await ws.wait_closed()
            return err, ws.close_code  # type: ignore[return-value]

    for q in (f"?token={tok}", f"?Access_Token={tok}"):
        err, code = await refused(ws_url(live_server.url, sid, q))
        assert (err["code"], code) == ("token_in_url", 4400)
    # an unknown id and a wrong token answer alike (the same event, the same close code)
    unknown = await refused(ws_url(live_server.url, "nope"), {"Authorization": f"Bearer {tok}"})
    wrong = await refused(ws_url(live_server.url, sid), {"Authorization": "Bearer wrong"})
    assert unknown == wrong and (unknown[0]["code"], unknown[1]) == ("session_not_found", 4404)
    err, code = await refused(ws_url(live_server.url, sid), first=json.dumps({"type": "hello"}))
    assert (err["code"], code) == ("unauthorized", 4401) and "auth" in err["message"]
    async with await StreamClient.attach(live_server.url, sid, tok, auth="message") as c:
        assert (await c.next_frame()).keyframe
        # a second stream on the same session is refused; the first one keeps streaming
        err, code = await refused(ws_url(live_server.url, sid), {"Authorization": f"Bearer {tok}"})
        assert (err["code"], code) == ("stream_busy", 4409)
        await c.wait_event(lambda e: e["event"] == "media")  # the first stream keeps streaming
        assert c.closed_code is None


async def test_a_client_that_closes_and_reconnects_at_once_is_not_refused_as_busy(live_server) -> None:  # type: ignore[no-untyped-def]
    s = await create(live_server.url, seed=6)
    for _ in range(3):
        c = await StreamClient.attach(live_server.url, s["session_id"], s["token"])
        assert (await c.next_frame()).keyframe  # a fresh stream starts at a keyframe
        await c.aclose(delete=False)  # and the next attach follows at once
    # deterministically: the previous stream is still ending (its entry leaves 0.2 s from now)
    streams = live_server.app.state.streams
    await until_gone(streams, s["session_id"])
    streams[s["session_id"]] = "a stream still closing"
    asyncio.get_running_loop().call_later(0.2, streams.pop, s["session_id"])
    c = await StreamClient.attach(live_server.url, s["session_id"], s["token"])
    assert (await c.next_frame()).keyframe
    await c.aclose(delete=False)
    async with httpx.AsyncClient(base_url=live_server.url) as http:
        await http.delete(f"/v1/sessions/{s['session_id']}", headers={"Authorization": f"Bearer {s['token']}"})


async def test_ping_echoes_finite_numbers_only(live_server) -> None:  # type: ignore[no-untyped-def]
    async with await StreamClient.connect(live_server.url, seed=7) as c:
        await c.next_frame()
        for raw, want in (('{"type": "ping", "t": 12.5}', 12.5), ('{"type": "ping", "t": NaN}', None),
                          ('{"type": "ping", "t": -Infinity}', None), ('{"type": "ping", "t": true}', None)):
            await c.send_raw(raw)
            pong = await c.wait_event(lambda e: e["event"] == "pong")  # answered in order, one per ping
            assert pong["t"] == want, (raw, pong)


async def test_deleting_the_session_closes_its_stream(live_server) -> None:  # type: ignore[no-untyped-def]
    c = await StreamClient.connect(live_server.url, seed=5)
    await c.next_frame()
    async with httpx.AsyncClient(base_url=live_server.url) as http:
        r = await http.delete(f"/v1/sessions/{c.session_id}", headers={"Authorization": f"Bearer {c.token}"})
        assert r.status_code == 204
    await c.wait_event(lambda e: e["event"] == "state" and e["state"] == "closed", past=True)
    await asyncio.wait_for(c._reader, 10)
    assert c.closed_code == 1000
    await until_gone(live_server.app.state.streams, c.session_id)  # unregistered once its run loop ends
    await c.aclose(delete=False)


async def test_a_reader_stalled_10_s_costs_bounded_memory_and_resumes_at_a_fresh_keyframe(live_server) -> None:  # type: ignore[no-untyped-def]
    """The reader stops reading for 10 s (a small receive buffer, as a slow link would give): the server
    drops media instead of queueing it, and the first frame after the gap is a keyframe."""
    import time

    from worldcast.transport.stream.queue import MAX_MEDIA_BYTES

    s = await create(live_server.url, seed=6)
    sid = s["session_id"]
    sock = small_buffer_socket(live_server.url)
    async with connect(ws_url(live_server.url, sid), sock=sock, compression=None, max_queue=1,
                       additional_headers={"Authorization": f"Bearer {s['token']}"}) as ws:
        msgs: list[str | bytes] = []
        while sum(isinstance(m, bytes) for m in msgs) < 10:
            msgs.append(await asyncio.wait_for(ws.recv(), 15))
        conn = live_server.app.state.streams[sid]
        assert conn.out.transport is not None, "the stream's socket was not tuned (StreamSocketTuning)"
        peak_queue, peak_transport, t_end = 0, 0, time.monotonic() + 10.0
        while time.monotonic() < t_end:  # the stall: nothing is read for 10 s
            peak_queue = max(peak_queue, conn.queue.media_bytes)
            peak_transport = max(peak_transport, conn.out.write_buffer_bytes)
            await asyncio.sleep(0.05)
        stats = conn.queue.stats
        assert stats.media_dropped > 0 and stats.slow_reader_drops >= 1, stats
        assert stats.max_media_bytes <= MAX_MEDIA_BYTES and conn.queue.control_items < 16
        print(f"\nstalled 10 s: queue peak {stats.max_media_bytes / 1024:.1f} KiB (sampled {peak_queue / 1024:.1f}), "
              f"transport buffer peak {peak_transport / 1024:.1f} KiB, {stats.media_dropped} media dropped, "
              f"{conn.out.bytes_out / 1024:.0f} KiB sent")
        assert peak_transport < 2 * MAX_MEDIA_BYTES
        # resume: read the backlog the socket buffers held, then the fresh keyframe after the gap
        events: list[dict] = []  # type: ignore[type-arg]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = await asyncio.wait_for(ws.recv(), 15)
            msgs.append(m)
            if isinstance(m, str):
                events.append(json.loads(m))
            media = [e for e in events if e["event"] == "media"]
            gaps = [i for i in range(1, len(media)) if media[i]["frame_index"] > media[i - 1]["frame_index"] + 1]
            if gaps and len(media) > gaps[0] + 5:
                break
        assert gaps, "no frames were dropped during the stall"
        after = media[gaps[0]]
        assert after["keyframe"], "media resumes at a keyframe (the GOP's or one asked for once drained)"
    data = b"".join(m for m in msgs if isinstance(m, bytes))
    with av.open(io.BytesIO(data)) as f:
        decoded = list(f.decode(video=0))
    assert len(decoded) == sum(isinstance(m, bytes) for m in msgs) - 1  # every media segment decodes


async def test_a_reader_that_never_reads_its_replies_is_dropped_and_the_session_lives_on(live_server) -> None:  # type: ignore[no-untyped-def]
    """A client sends pings and reads nothing: once more control replies wait than the queue holds, the
    server drops the connection (a close frame would only queue behind them); other streams never notice."""
    from worldcast.transport.stream.queue import MAX_CONTROL_ITEMS

    s = await create(live_server.url, seed=8)
    sid = s["session_id"]
    sock = small_buffer_socket(live_server.url)
    async with await StreamClient.connect(live_server.url, seed=9) as other:
        await other.next_frame()
        async with connect(ws_url(live_server.url, sid), sock=sock, compression=None, max_queue=1,
                           additional_headers={"Authorization": f"Bearer {s['token']}"}) as ws:
            await asyncio.wait_for(ws.recv(), 15)  # stream_start: the stream is registered
            streams = live_server.app.state.streams
            assert sid in streams
            ping = json.dumps({"type": "ping", "t": 1})
            try:  # at ~200 pings/s, under the stream's message rate (each one is answered, not rate-limited)
                for i in range(20 * MAX_CONTROL_ITEMS):  # bounded; the server drops us long before the end
                    await ws.send(ping)
                    if sid not in streams:
                        break
                    if i % 10 == 9:
                        await asyncio.sleep(0.05)
            except Exception:  # noqa: BLE001 - the connection was dropped under us: that is the point
                pass
            # dropped at once, not after the close handshake's timeout (10 s): a close frame would only
            # queue behind the replies that are never read
            await until_gone(streams, sid, timeout_s=8)
        assert other.closed_code is None
        await other.wait_event(lambda e: e["event"] == "media")  # the other stream goes on
    async with httpx.AsyncClient(base_url=live_server.url) as http:
        st = await http.get(f"/v1/sessions/{sid}", headers={"Authorization": f"Bearer {s['token']}"})
        assert st.status_code == 200 and st.json()["state"] != "closed"  # the stream died, not the session
        await http.delete(f"/v1/sessions/{sid}", headers={"Authorization": f"Bearer {s['token']}"})


async def test_stream_inputs_are_counted_in_metrics_like_the_data_channels(live_server) -> None:  # type: ignore[no-untyped-def]
    from tests.transport.test_hardening import input_counts

    async with httpx.AsyncClient(base_url=live_server.url) as http:
        before = input_counts((await http.get("/metrics")).text)
        async with await StreamClient.connect(live_server.url, seed=10) as c:
            await c.next_frame()
            await c.send_action(keys=["w"])
            await c.send_raw(json.dumps({"seq": 99, "t": 0, "keys": ["teleport"], "mouse": [0, 0]}))
            await c.wait_event(lambda e: e["event"] == "action_rejected")
            await c.rpc("get_state")
        after = input_counts((await http.get("/metrics")).text)
    grew = {k for k in after if after[k] > before.get(k, 0.0)}
    assert {("actions", "accepted"), ("actions", "invalid"), ("control", "accepted")} <= grew, grew
