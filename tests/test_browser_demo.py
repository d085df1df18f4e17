"""The built web demo in headless Chromium (Debian's package, driven by Playwright) against a real server.

Needs `web_demo/dist` (`npm --prefix web_demo ci && npm --prefix web_demo run build`; `make test` does it):
a missing build fails the test. A missing Chromium skips it, except in CI (env CI set), where it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from worldcast.transport.config import DEFAULT_STATIC_DIR

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]
SCREENSHOT = "/tmp/worldcast_demo.png"
BUILD_COMMAND = "npm --prefix web_demo ci && npm --prefix web_demo run build"
#: Longest wait for any one condition in the page, s. Generous: 2 CPU cores shared with the model.
WAIT_S = 20.0
pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def _require_chromium() -> None:
    if os.path.exists(CHROMIUM):
        return
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing in CI (apt-get install chromium)")
    pytest.skip(f"{CHROMIUM} is not installed (make test installs it)")


def wait_js(page: Any, expr: str, what: str, timeout_s: float = WAIT_S) -> Any:
    """Wait until the JS expression is truthy and return its value; fail with `what` and the stats."""
    try:
        page.wait_for_function(expr, timeout=timeout_s * 1000)
    except Exception as e:  # playwright's TimeoutError
        stats = page.evaluate("JSON.stringify(window.__worldcast)")
        status = page.text_content("#status")
        pytest.fail(f"{what}: not within {timeout_s:g} s ({type(e).__name__}); stats {stats}; status {status!r}")
    return page.evaluate(expr)


def stat(page: Any, name: str) -> Any:
    return page.evaluate(f"window.__worldcast.{name}")


@contextlib.contextmanager
def demo_page(server: Any, *, init_script: str | None = None, screenshot: str = SCREENSHOT) -> Iterator[Any]:
    """The built demo of `server` in a fresh headless Chromium page (its `page.goto` done); on the way out a
    screenshot of a failure goes to `screenshot`, and an error the page threw fails the test."""
    dist = Path(server.config.static_dir or DEFAULT_STATIC_DIR)
    assert (dist / "index.html").exists(), f"{dist}/index.html is missing: build the demo first: {BUILD_COMMAND}"
    _require_chromium()
    from playwright.sync_api import sync_playwright

    page_errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 800, "height": 800})
        try:
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            if init_script is not None:
                page.add_init_script(init_script)
            page.goto(server.url + "/")
            yield page
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=screenshot)  # what the page looked like when it failed
            raise
        finally:
            browser.close()
    assert page_errors == []


def test_demo_connects_plays_and_applies_a_key_press(live_server) -> None:  # type: ignore[no-untyped-def]
    with demo_page(live_server) as page:
        assert page.title() == "worldcast demo"
        page.click("#connect")
        session_id = wait_js(page, "window.__worldcast.connected && window.__worldcast.sessionId",
                             "connect (session + WebRTC)")
        assert session_id in live_server.manager.sessions
        wait_js(page, "window.__worldcast.framesReceived >= 5", "frame events on the control channel")

        # The <video> really plays: its clock advances and it presents new frames.
        t0, v0 = page.evaluate("[document.getElementById('video').currentTime, window.__worldcast.videoFrames]")
        wait_js(page, f"document.getElementById('video').currentTime > {t0} + 0.2", "video currentTime advancing")
        wait_js(page, f"window.__worldcast.videoFrames >= {v0} + 3", "video frames presented")
        assert page.evaluate("document.getElementById('video').videoWidth") > 0

        # Hold D: the key state goes out at once and then at ~60 Hz; the server applies it.
        assert stat(page, "lastSentSeq") == -1, "no action should be sent before any input"
        page.keyboard.down("d")
        wait_js(page, "window.__worldcast.lastSentSeq >= 9", "action messages repeated while the key is held")
        sent, keys = page.evaluate("[window.__worldcast.lastSentSeq, window.__worldcast.lastSentKeys]")
        assert keys == ["d"]
        applied = wait_js(page, f"window.__worldcast.lastAppliedSeq >= {sent} && window.__worldcast.lastAppliedSeq",
                          f"a frame applying action seq {sent} (key d held)")
        assert applied >= sent
        lag = stat(page, "lagMs")
        assert lag is not None and 0 < lag < WAIT_S * 1000

        # Release: a message without the key goes out at once, and gets applied too.
        page.keyboard.up("d")
        released, keys = page.evaluate("[window.__worldcast.lastSentSeq, window.__worldcast.lastSentKeys]")
        assert released > sent and keys == []
        wait_js(page, f"window.__worldcast.lastAppliedSeq >= {released}", "a frame applying the key release")

        # A new prompt: set_prompt then flush; frames of the new epoch arrive.
        page.fill("#prompt", "a snowy field")
        page.click("#set-prompt")
        wait_js(page, "window.__worldcast.epoch >= 1", "frames after set_prompt + flush")
        page.wait_for_timeout(400)  # let the overlay (refreshed every 250 ms) catch up
        page.screenshot(path=SCREENSHOT)

        stats = page.evaluate("window.__worldcast")
        assert stats["rejected"] == 0 and stats["errors"] == [], stats

        # Disconnect deletes the session on the server.
        page.click("#connect")
        wait_js(page, "!window.__worldcast.connected", "disconnect")
        deadline = time.monotonic() + WAIT_S
        while session_id in live_server.manager.sessions and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert session_id not in live_server.manager.sessions, "Disconnect did not delete the session"


#: A standard-mapping gamepad the page reads through `navigator.getGamepads` (FAKE: a CI machine has no gamepad;
#: the Gamepad API only reads pads, so replacing the reader is the whole device). The test moves its sticks.
FAKE_GAMEPAD = """
window.__pad = {id: "fake standard gamepad", index: 0, connected: true, mapping: "standard", timestamp: 0,
                axes: [0, 0, 0, 0],
                buttons: Array.from({length: 17}, () => ({pressed: false, touched: false, value: 0}))};
navigator.getGamepads = () => [window.__pad, null, null, null];
"""


def test_demo_drives_the_model_s_declared_axes_from_a_gamepad(live_server) -> None:  # type: ignore[no-untyped-def]
    """The page binds a gamepad as the model declares (GET /v1/model: axes, bindings): the left stick's position
    and the d-pad reach the session's engine as TinyWorld's move_x axis and key d; back at rest, the engine's
    positions return to rest. The session is recorded (Record ticked at Connect) and its log downloads from the
    page, the stick's axis in it."""
    with demo_page(live_server, init_script=FAKE_GAMEPAD) as page:
        page.check("#record")
        page.click("#connect")
        sid = wait_js(page, "window.__worldcast.connected && window.__worldcast.sessionId", "connect")
        wait_js(page, "window.__worldcast.framesReceived >= 2", "frames")
        assert "left stick" in page.text_content("#keys-help"), "the help names the bound gamepad inputs"
        assert stat(page, "lastSentSeq") == -1, "a pad at rest sends nothing"

        session = live_server.manager.sessions[sid]
        engine = live_server.manager.engines[session.engine_id]

        def positions() -> dict[str, float]:
            cond = engine.core.conditioner(sid)
            return {} if cond is None else dict(cond.conditioner_state().positions)

        page.evaluate("window.__pad.axes[0] = 0.9; window.__pad.buttons[15].pressed = true")
        wait_js(page, "window.__worldcast.lastSentAxes.move_x === 0.9", "the stick's position sent")
        assert stat(page, "lastSentKeys") == ["d"], "the d-pad's right holds d"
        sent = stat(page, "lastSentSeq")
        wait_js(page, f"window.__worldcast.lastAppliedSeq >= {sent}", "a frame applying the stick")
        assert positions()["move_x"] == 0.9 and positions()["look_x"] == 0.0

        page.evaluate("window.__pad.axes[0] = 0.05; window.__pad.buttons[15].pressed = false")  # in the deadzone
        wait_js(page, "window.__worldcast.lastSentSeq > 0 && Object.keys(window.__worldcast.lastSentAxes).length "
                "=== 0 && window.__worldcast.lastSentKeys.length === 0", "the pad at rest sent")
        rest = stat(page, "lastSentSeq")
        wait_js(page, f"window.__worldcast.lastAppliedSeq >= {rest}", "a frame applying the release")
        assert set(positions().values()) == {0.0}
        assert stat(page, "rejected") == 0

        assert page.is_visible("#download")
        with page.expect_download() as d:
            page.click("#download")
        lines = [json.loads(x) for x in Path(d.value.path()).read_text().splitlines()]
        assert lines[0]["type"] == "header" and lines[0]["from_start"] and lines[0]["session_id"] == sid
        assert any(e["type"] == "action" and (e.get("axes") or {}).get("move_x") == 0.9 for e in lines)
        with page.expect_download() as d:  # the film: the session's one encode as MP4, served so far
            page.click("#download-film")
        film = Path(d.value.path()).read_bytes()
        assert d.value.suggested_filename == f"{sid}.mp4" and film[4:8] == b"ftyp" and b"moof" in film


def test_share_gives_a_watch_link_that_plays_the_session_view_only(live_server) -> None:  # type: ignore[no-untyped-def]
    """Share mints a viewer token; its link opens the watch page, where a WHEP player that is not ours (Eyevinn's)
    plays the session while its controller keeps it."""
    with demo_page(live_server) as page:
        page.click("#connect")
        sid = wait_js(page, "window.__worldcast.connected && window.__worldcast.sessionId", "connect")
        wait_js(page, "window.__worldcast.framesReceived >= 2", "frames")
        page.click("#share")
        wait_js(page, "!document.getElementById('watch-link').hidden", "the watch link")
        link = page.get_attribute("#watch-link", "href")
        assert link is not None and "#whep=" in link and "token=" in link and "watch.html" in link
        watcher = page.context.browser.new_page(viewport={"width": 800, "height": 800})
        try:
            watcher.goto(link)
            wait_js(watcher, "window.__watch.state === 'playing' || window.__watch.state === 'failed'", "the player")
            assert watcher.evaluate("window.__watch.state") == "playing", watcher.evaluate("window.__watch")
            wait_js(watcher, "document.getElementById('video').videoWidth > 0", "video from WHEP")
            t0 = watcher.evaluate("document.getElementById('video').currentTime")
            wait_js(watcher, f"document.getElementById('video').currentTime > {t0} + 0.2", "the video playing")
            s = live_server.manager.sessions[sid]
            assert len(s.viewers.spectators) == 1 and s.viewer_count == 1, "a spectator, not a second viewer"
        finally:
            watcher.close()
