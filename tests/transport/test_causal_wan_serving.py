"""`causal-wan:tiny` served over real WebRTC peers: 4 pixel frames per latent frame at the model's fps, strictly
increasing PTS on the 90 kHz clock, two sessions batched on the one device."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import _serve, server_config
from worldcast.transport.clients.webrtc import WebRTCClient

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def wan_server():  # type: ignore[no-untyped-def]
    from worldcast.models.causal_wan.loading import tiny_parts
    from worldcast.models.causal_wan.model import CausalWanModel

    model = CausalWanModel(tiny_parts(), name="causal-wan:tiny")
    yield from _serve(server_config(model="causal-wan:tiny"), model)


async def _frame_events(c: WebRTCClient, n: int, timeout_s: float = 120.0) -> list[dict]:  # type: ignore[type-arg]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while len(c.frame_events) < n:
        assert loop.time() < end, f"only {len(c.frame_events)} frame events"
        await asyncio.sleep(0.05)
    return list(c.frame_events)


async def test_two_sessions_stream_batched_with_four_frames_per_latent_frame(wan_server) -> None:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=wan_server.url) as http:
        info = (await http.get("/v1/model")).json()
    assert (info["fps"], info["latent_frames_per_chunk"], info["pixel_frames_per_latent"]) == (16, 3, 4)
    assert (info["first_chunk_frames"], info["frames_per_chunk"]) == (9, 12)
    a = await WebRTCClient.connect(wan_server.url, seed=1)
    b = await WebRTCClient.connect(wan_server.url, seed=2)
    try:
        video = [await a.next_frame(timeout_s=60) for _ in range(10)]
        ev_a, ev_b = await _frame_events(a, 33), await _frame_events(b, 33)  # the first chunk, then two more
        for ev in (ev_a, ev_b):
            idx = [e["frame_index"] for e in ev]
            assert idx[:33] == list(range(33)), idx[:40]  # 9 + 12 + 12, none dropped
            pts = [e["pts"] for e in ev]
            assert all(q - p == 90_000 // 16 for p, q in zip(pts, pts[1:])), "one frame period apart at 16 fps"
        vpts = [f.pts for f in video]
        assert all(q > p for p, q in zip(vpts, vpts[1:]))
        assert (video[0].width, video[0].height) == (64 * wan_server.config.video_scale,) * 2
        async with httpx.AsyncClient(base_url=wan_server.url) as http:
            metrics = (await http.get("/metrics")).text
        batched = [line for line in metrics.splitlines()
                   if line.startswith('worldcast_step_batch_size_bucket{kind="denoise",le="1.0"}')]
        total = [line for line in metrics.splitlines()
                 if line.startswith('worldcast_step_batch_size_count{kind="denoise"}')]
        assert float(total[0].split()[-1]) > float(batched[0].split()[-1]), "some denoise steps ran both sessions"
    finally:
        await a.aclose()
        await b.aclose()
