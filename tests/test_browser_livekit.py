"""The web demo's LiveKit mode in headless Chromium: the page joins a real livekit-server room as the
session's user (livekit-client), plays the world's track, and a held key is applied.

Needs `web_demo/dist` and Chromium as `test_browser_demo.py` does, and the livekit-server binary
(`make livekit-server`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import LiveServer, _serve, server_config
from tests.test_browser_demo import WAIT_S, demo_page, stat, wait_js

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]
SCREENSHOT = "/tmp/worldcast_demo_livekit.png"


@pytest.fixture(scope="module")
def lk_demo_server(model, livekit_server) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    from worldcast.transport.livekit.config import LiveKitConfig

    cfg = LiveKitConfig(url=livekit_server.url, api_key=livekit_server.api_key, api_secret=livekit_server.api_secret)
    yield from _serve(server_config(livekit=cfg), model)


def test_livekit_mode_plays_and_applies_a_key_press(lk_demo_server) -> None:  # type: ignore[no-untyped-def]
    server = lk_demo_server
    with demo_page(server, screenshot=SCREENSHOT) as page:
        page.select_option("#transport", "livekit")
        assert page.is_visible("#room")
        page.fill("#room", "browser-room")
        page.click("#connect")
        session_id = wait_js(page, "window.__worldcast.connected && window.__worldcast.sessionId",
                             "connect (session + LiveKit room)")
        world = server.app.state.livekit.worlds[session_id]
        assert world.room_name == "browser-room"
        wait_js(page, "window.__worldcast.framesReceived >= 5", "frame metadata on the frames topic")
        t0, v0 = page.evaluate("[document.getElementById('video').currentTime, window.__worldcast.videoFrames]")
        wait_js(page, f"document.getElementById('video').currentTime > {t0} + 0.2", "video currentTime advancing")
        wait_js(page, f"window.__worldcast.videoFrames >= {v0} + 3", "video frames presented")
        assert page.evaluate("document.getElementById('video').videoWidth") > 0

        # hold D: action packets go out, the world applies them, the overlay shows it
        page.keyboard.down("d")
        page.wait_for_timeout(1000)
        sent, keys = page.evaluate("[window.__worldcast.lastSentSeq, window.__worldcast.lastSentKeys]")
        assert keys == ["d"] and sent >= 10
        wait_js(page, f"window.__worldcast.lastAppliedSeq >= {sent}", f"a frame applying action seq {sent}")
        assert server.manager.sessions[session_id].inputs.actions.last_seq >= sent
        assert stat(page, "lagMs") is not None
        page.keyboard.up("d")

        # an RPC: set_prompt then flush (LiveKit RPC methods on the world)
        page.fill("#prompt", "a snowy field")
        page.click("#set-prompt")
        wait_js(page, "window.__worldcast.epoch >= 1", "frames after set_prompt + flush")
        assert server.manager.sessions[session_id].prompt == "a snowy field"
        page.wait_for_timeout(400)  # let the overlay (refreshed every 250 ms) catch up
        page.screenshot(path=SCREENSHOT)
        overlay = page.text_content("#stats") or ""
        assert "epoch 1" in overlay or "epoch 2" in overlay, overlay
        stats = page.evaluate("window.__worldcast")
        assert stats["rejected"] == 0 and stats["errors"] == [], stats

        # disconnect: the page leaves the room and deletes the session
        page.click("#connect")
        wait_js(page, "!window.__worldcast.connected", "disconnect")
        deadline = time.monotonic() + WAIT_S
        while session_id in server.manager.sessions and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert session_id not in server.manager.sessions
