"""The test LiveKit server itself: real SDK participants meet on loopback."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.timeout(60)


async def test_two_participants_exchange_data_on_loopback(livekit_server) -> None:  # type: ignore[no-untyped-def]
    from livekit import api, rtc

    def token(identity: str) -> str:
        return (api.AccessToken(livekit_server.api_key, livekit_server.api_secret).with_identity(identity)
                .with_grants(api.VideoGrants(room_join=True, room="probe")).to_jwt())

    # media stays on loopback: the server advertises 127.0.0.1 as its node IP
    assert '"nodeIP": "127.0.0.1"' in livekit_server.log_head()
    a, b = rtc.Room(), rtc.Room()
    got: asyncio.Future[rtc.DataPacket] = asyncio.get_running_loop().create_future()
    b.on("data_received", lambda p: got.done() or got.set_result(p))
    try:
        await a.connect(livekit_server.url, token("a"))
        await b.connect(livekit_server.url, token("b"))
        for _ in range(50):  # until b is known to a (the participant update may lag the join)
            if "b" in a.remote_participants:
                break
            await asyncio.sleep(0.05)
        await a.local_participant.publish_data(b"hello", topic="t", destination_identities=["b"])
        p = await asyncio.wait_for(got, 10)
        assert (p.data, p.topic) == (b"hello", "t")
    finally:
        await a.disconnect()
        await b.disconnect()
