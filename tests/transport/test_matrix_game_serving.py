"""`matrix-game-2:tiny` (random weights, fake image encoders) served end to end: it declares keyboard and mouse,
takes a starting image, refuses text, and streams to an independent aiortc client sending keys and mouse, and
over the fMP4 WebSocket stream."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import _serve, server_config
from tests.fake_models import png
from worldcast.models import registry
from worldcast.transport.clients import StreamClient, WebRTCClient

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mg_server():  # type: ignore[no-untyped-def]
    model = registry.load("matrix-game-2:tiny")
    yield from _serve(server_config(model="matrix-game-2:tiny", video_scale=2), model)


def test_matrix_game_declares_keys_mouse_and_an_image(mg_server) -> None:  # type: ignore[no-untyped-def]
    m = httpx.get(f"{mg_server.url}/v1/model").json()
    assert m["name"] == "matrix-game-2:tiny" and m["fps"] == 12
    assert m["actions"]["keys"][:4] == ["w", "s", "a", "d"] and {"i", "j", "k", "l"} <= set(m["actions"]["keys"])
    assert [a["name"] for a in m["actions"]["mouse"]] == ["yaw", "pitch"]
    assert m["actions"]["history_pixel_frames"] == 9
    assert m["conditioning"]["text"] is None and m["conditioning"]["image"]["default"]
    r = httpx.post(f"{mg_server.url}/v1/sessions", json={"prompt": "a castle"})
    assert r.status_code == 422 and r.json()["detail"].startswith("prompt: this model takes no text prompt")


async def test_matrix_game_streams_to_an_aiortc_client_sending_keys_and_mouse(mg_server) -> None:  # type: ignore[no-untyped-def]
    async with await WebRTCClient.connect(mg_server.url, image=png((90, 140, 200), size=(160, 90)), seed=3) as c:
        frames, seqs = [], set()
        for i in range(36):
            if i % 3 == 0:
                c.send_action(keys=["w", "d"] if i % 2 else ["s"], mouse=(12.0 * (i % 5), -4.0))
            f = await c.next_frame(timeout_s=60)
            frames.append(f)
        assert len(frames) >= 30 and (frames[0].width, frames[0].height) == (224, 128)  # 112x64, scaled x2
        pts = [f.pts for f in frames]
        assert all(b > a for a, b in zip(pts, pts[1:])), "PTS strictly increasing"
        ev = await c.wait_event(lambda e: e.get("event") == "frame" and e.get("action_seq", -1) >= 0, timeout_s=60)
        seqs.add(ev["action_seq"])
        assert seqs, "a frame says which action it applied"


async def test_matrix_game_streams_fmp4_over_the_websocket(mg_server) -> None:  # type: ignore[no-untyped-def]
    async with await StreamClient.connect(mg_server.url, seed=4) as s:  # no image: the declared default picture
        got = 0
        while got < 12:
            await asyncio.wait_for(s.next_frame(), 60)
            got += 1
            if got % 4 == 0:
                await s.send_action(keys=["a"], mouse=(0.0, 20.0))
        assert got == 12
