"""Issue 22 against the real livekit-server: README's flags work, user tokens die with their TTL, a
flooding user is removed from the room.

The TTL cases mint tokens "issued" in the past (`user_token(issued_at_s=...)`) instead of waiting out a
TTL. Tokens carry exactly their TTL (issue 31 stopped cutting `exp` short by the server's leeway, which put
it before `nbf`); late joiners are removed through the room service (they are in the room until the world
removes them; `test_a_late_joiner_with_a_full_length_token_is_removed` prints for how long).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import LiveServer, _serve, server_config
from tests.transport.livekit.conftest import livekit_config

pytestmark = pytest.mark.timeout(180)
lk = pytest.importorskip("livekit.rtc")


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 15.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def readme_server(model, livekit_server) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    """The LiveKit flags of docs/api.md: no --video-scale; a 10 s user token TTL (the shortest allowed)."""
    from worldcast.transport.limits import InputLimits

    cfg = server_config(video_scale=None, livekit=livekit_config(livekit_server, user_token_ttl_s=10.0),
                        input_limits=InputLimits(abuse_rejections_per_s=20, abuse_sustained_s=2.0))
    yield from _serve(cfg, model)


async def joins(url: str, token: str) -> bool:
    from livekit import rtc

    r = rtc.Room()
    try:
        await asyncio.wait_for(r.connect(url, token), 10)
        return True
    except Exception:  # noqa: BLE001 - rtc.ConnectError: refused ("token is expired")
        return False
    finally:
        await r.disconnect()


async def test_readme_flags_create_answers_201_and_streams_at_the_common_scale(readme_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.clients.livekit import LiveKitUser

    u = await LiveKitUser.create(readme_server.url, room="readme-1", seed=1)
    try:
        f = await u.next_frame(30)
        assert (f.width, f.height) == (256, 256)  # the scale rule of WebRTC and fMP4 (ServerConfig.scale_for)
    finally:
        await u.aclose()


async def test_the_servers_leeway_and_tokens_cut_short_by_it(readme_server, livekit_server) -> None:  # type: ignore[no-untyped-def]
    from livekit import api

    from worldcast.transport.livekit.tokens import SERVER_LEEWAY_S, user_token

    def raw(exp_in_s: float) -> str:  # a plain token, exp this far from now
        return (api.AccessToken(livekit_server.api_key, livekit_server.api_secret).with_identity("probe")
                .with_ttl(datetime.timedelta(seconds=exp_in_s))
                .with_grants(api.VideoGrants(room_join=True, room="leeway")).to_jwt())

    # the leeway: 30 s past exp still joins, a minute past does not (the "joins 60 s past the TTL")
    assert await joins(livekit_server.url, raw(-30)) and not await joins(livekit_server.url, raw(-SERVER_LEEWAY_S - 5))
    cfg = readme_server.config.livekit
    ttl = cfg.user_token_ttl_s
    fresh = user_token(cfg, room="ttl-1", identity="user-a", issued_at_s=time.time() - (ttl - 3))
    assert await joins(livekit_server.url, fresh), "a token within its TTL must join"
    # tokens are no longer cut short by the leeway (issue 31: exp came before nbf); one past its TTL is not
    # minted, and a user joining in the leeway is removed by the world (the next test)
    with pytest.raises(ValueError, match="run out"):
        user_token(cfg, room="ttl-1", identity="user-b", issued_at_s=time.time() - (ttl + 3))


async def test_a_late_joiner_with_a_full_length_token_is_removed(readme_server, livekit_server) -> None:  # type: ignore[no-untyped-def]
    """The other fix, as defence in depth: a token that is not cut short joins (the leeway), and the world
    removes it through the room service. It is in the room meanwhile, which is why tokens are cut short."""
    import httpx
    from livekit import api, rtc

    # a session whose user has not joined yet, its TTL over; the user comes with a full-length stale token
    async with httpx.AsyncClient(base_url=readme_server.url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "late-2"})
        assert r.status_code == 201
        s = r.json()
    world = readme_server.app.state.livekit.worlds[s["session_id"]]  # type: ignore[attr-defined]
    world.join_deadline_s = time.time() - 5
    tok = (api.AccessToken(livekit_server.api_key, livekit_server.api_secret).with_identity(s["livekit"]["identity"])
           .with_ttl(datetime.timedelta(seconds=-5))
           .with_grants(api.VideoGrants(room_join=True, room="late-2", can_update_own_metadata=True)).to_jwt())
    late = rtc.Room()
    gone = asyncio.Event()
    late.on("disconnected", lambda *a: gone.set())
    await late.connect(livekit_server.url, tok)  # the SFU lets it in: the leeway
    t_in = time.monotonic()
    await late.local_participant.set_attributes({"worldcast.role": "user"})  # announce at once
    await asyncio.wait_for(gone.wait(), 15)
    in_room_ms = (time.monotonic() - t_in) * 1e3
    print(f"late joiner removed {in_room_ms:.0f} ms after joining")
    assert world.removed and world.removed[0][1] == "joined after its token's TTL"
    assert world.session.viewer_count == 0  # never attached: no frames were streamed for it
    await late.disconnect()


async def test_a_flooding_livekit_user_is_told_and_removed_from_the_room(readme_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.transport.clients.livekit import LiveKitUser

    u = await LiveKitUser.create(readme_server.url, room="flood-1", seed=3)
    gone = asyncio.Event()
    u.room.on("disconnected", lambda *a: gone.set())
    try:
        await u.next_frame(30)
        t0 = time.monotonic()
        while not gone.is_set() and time.monotonic() - t0 < 30:
            for _ in range(20):
                u.send_raw(b"{junk")
                u.send_raw(json.dumps({"x": 1}), topic="elsewhere")  # other topics count too
            await asyncio.sleep(0.02)
        await asyncio.wait_for(gone.wait(), 15)
        assert any(e.get("event") == "disconnect" and e.get("reason") == "flood" for e in u.events)
        summaries = [e for e in u.events if e.get("event") in ("action_rejected", "error")]
        assert len(summaries) <= 4 * (time.monotonic() - t0) + 4  # coalesced, not one per packet
        await until(lambda: u.session_id not in readme_server.manager.sessions, "the flooder's session closed")
    finally:
        await u.aclose()
