"""A WHEP player that is not ours plays a session in headless Chromium: Eyevinn's `@eyevinn/webrtc-player`
(npm, its WHEP adapter, unchanged) with a viewer token, while the controller acts over the worldcast stream; its
`unload` DELETEs the resource. The page is served from the server's own origin, and from another one (CORS).

Needs the player's bundle (`npm --prefix tests/whep_player ci && npm --prefix tests/whep_player run build`;
`make test` does it): a missing bundle fails the test. A missing Chromium skips it, except in CI.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, _serve, server_config
from tests.test_browser_demo import CHROMIUM, CHROMIUM_ARGS, WAIT_S, _require_chromium
from worldcast.transport.clients import StreamClient

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

PLAYER_DIR = Path(__file__).parent / "whep_player"
BUILD_COMMAND = "npm --prefix tests/whep_player ci && npm --prefix tests/whep_player run build"


@pytest.fixture(scope="module")
def whep_server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    """A server whose page is the WHEP player (same origin: no CORS needed)."""
    yield from _serve(server_config(static_dir=PLAYER_DIR), model)


@pytest.fixture(scope="module")
def other_origin() -> Iterator[str]:
    """The player's page served from another origin (another port): its WHEP requests are cross-origin."""
    from tests.conftest import free_port

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(PLAYER_DIR))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join(5)


async def wait_js(page: Any, expr: str, what: str, timeout_s: float = WAIT_S) -> Any:
    try:
        await page.wait_for_function(expr, timeout=timeout_s * 1000)
    except Exception as e:  # playwright's TimeoutError
        errors = await page.evaluate("JSON.stringify(window.whep.errors)")
        pytest.fail(f"{what}: not within {timeout_s:g} s ({type(e).__name__}); player errors {errors}")
    return await page.evaluate(expr)


@pytest.mark.parametrize("origin", ["same", "other"])
async def test_eyevinns_whep_player_plays_a_session_and_leaves(whep_server: LiveServer, other_origin: str,
                                                               origin: str) -> None:
    server = whep_server
    page_url = (server.url if origin == "same" else other_origin) + "/index.html"
    assert (PLAYER_DIR / "dist" / "player.js").exists(), f"the WHEP player is not built: {BUILD_COMMAND}"
    _require_chromium()
    from playwright.async_api import async_playwright

    console: list[str] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=7) as c, async_playwright() as p:
        await c.next_frame()
        r = await http.post(f"/v1/sessions/{c.session_id}/viewers", headers={"Authorization": f"Bearer {c.token}"})
        v = r.json()
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            page.on("console", lambda m: console.append(m.text))
            await page.goto(page_url)
            await page.evaluate("([url, token]) => window.play(url, token)", [v["whep_url"], v["viewer_token"]])
            await wait_js(page, "document.getElementById('video').videoWidth > 0", "the player's video has a size")
            width = await page.evaluate("document.getElementById('video').videoWidth")
            assert width == 64 * server.config.video_scale, console[-20:]
            t0 = await page.evaluate("document.getElementById('video').currentTime")
            await wait_js(page, f"document.getElementById('video').currentTime > {t0} + 0.5", "the video playing")
            peers = server.app.state.whep.peers
            assert len(peers) == 1
            peer = next(iter(peers.values()))
            assert peer.spectator.viewer_id == v["viewer_id"] and peer.track.frames_out > 0
            assert peer.shares_encode, "Chromium offers H.264: the player plays the session's one encode"
            seq = await c.send_action(keys=["d"])  # the controller acts meanwhile; its stream goes on
            await c.wait_event(lambda e: e["event"] == "media" and e["action_seq"] >= seq, timeout_s=15)
            await page.evaluate("window.leave()")  # the player's unload: DELETE the resource
            deadline = time.monotonic() + WAIT_S
            while peers:
                assert time.monotonic() < deadline, "the resource was not deleted"
                await asyncio.sleep(0.05)
            assert not server.manager.sessions[c.session_id].viewers.spectators
            assert c.closed_code is None
        finally:
            await browser.close()
