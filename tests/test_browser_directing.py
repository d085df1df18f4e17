"""The directing page in headless Chromium: fMP4 over the WebSocket stream, played through MediaSource.

It plays a directing session through MSE, cuts a segment with a second direction, and checks that the picture
stays within 300 ms of the live edge (newest buffered frame minus the playhead, at every presented frame) for
WORLDCAST_LIVE_EDGE_S seconds: 20 by default (CI); the issue's bar is 60:

    WORLDCAST_LIVE_EDGE_S=60 .venv/bin/python -m pytest tests/test_browser_directing.py

Needs `web_demo/dist` (make test builds it); a missing Chromium skips it, except in CI.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from tests.test_browser_demo import BUILD_COMMAND, CHROMIUM, CHROMIUM_ARGS, _require_chromium
from worldcast.transport.config import DEFAULT_STATIC_DIR

#: Seconds the live edge is watched.
LIVE_EDGE_S = float(os.environ.get("WORLDCAST_LIVE_EDGE_S", "20"))
#: The bar: the playhead stays within this of the newest buffered frame, ms.
LIVE_EDGE_MS = 300
WAIT_S = 30.0
SCREENSHOT = "/tmp/worldcast_directing.png"

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120 + 2 * LIVE_EDGE_S)]


def wait_js(page, expr: str, what: str, timeout_s: float = WAIT_S):  # type: ignore[no-untyped-def]
    try:
        page.wait_for_function(expr, timeout=timeout_s * 1000)
    except Exception as e:  # playwright's TimeoutError
        stats = page.evaluate("JSON.stringify(window.__worldcastDirect)")
        pytest.fail(f"{what}: not within {timeout_s:g} s ({type(e).__name__}); stats {stats}; "
                    f"status {page.text_content('#status')!r}")
    return page.evaluate(expr)


def test_directing_page_plays_mse_at_the_live_edge_and_cuts_segments(live_server) -> None:  # type: ignore[no-untyped-def]
    dist = Path(live_server.config.static_dir or DEFAULT_STATIC_DIR)
    assert (dist / "direct.html").exists(), f"{dist}/direct.html is missing: build the demo first: {BUILD_COMMAND}"
    _require_chromium()
    from playwright.sync_api import sync_playwright

    page_errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 800, "height": 900})
        try:
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(live_server.url + "/direct.html")
            assert page.title() == "worldcast directing"
            page.click("#start")
            sid = wait_js(page, "window.__worldcastDirect.streaming && window.__worldcastDirect.sessionId",
                          "session + stream")
            assert live_server.manager.sessions[sid].mode == "directing"
            page.fill("#direction", "a green meadow")
            page.select_option("#duration", "open")
            page.click("#direct")
            wait_js(page, "window.__worldcastDirect.player.appended >= 10", "media appended to the SourceBuffer")
            mime = page.evaluate("window.__worldcastDirect.player.mime")
            assert mime.startswith('video/mp4; codecs="avc1.42C0'), mime
            assert page.evaluate("document.getElementById('video').src").startswith("blob:"), "MediaSource playback"
            t0 = page.evaluate("document.getElementById('video').currentTime")
            wait_js(page, f"document.getElementById('video').currentTime > {t0} + 0.5", "the video plays")
            wait_js(page, "window.__worldcastDirect.player.presented >= 10", "frames presented")

            page.evaluate("window.__worldcastDirectResetMax()")  # start-up over: measure from here
            polled, cut_sent = [], False
            end = time.monotonic() + LIVE_EDGE_S
            while time.monotonic() < end:
                polled.append(page.evaluate("window.__worldcastDirect.player.liveLatencyMs"))
                if not cut_sent and time.monotonic() > end - LIVE_EDGE_S / 2:
                    page.fill("#direction", "rivers of glowing molten lava")
                    page.click("#direct")  # a new direction mid-segment cuts it
                    cut_sent = True
                page.wait_for_timeout(200)
            s = page.evaluate("window.__worldcastDirect")
            player = s["player"]
            print(f"\nlive edge over {LIVE_EDGE_S:g} s: max {player['maxLiveLatencyMs']} ms over "
                  f"{player['latencySamples']} presented frames, polled max {max(x or 0 for x in polled)} ms; "
                  f"seeks {player['seeks']}, catch-ups {player['catchUps']}, {player['appended']} appends")
            assert player["errors"] == [] and s["errors"] == [], s
            assert player["latencySamples"] >= LIVE_EDGE_S * 3, "the video kept presenting frames"
            assert player["maxLiveLatencyMs"] <= LIVE_EDGE_MS, player
            assert max(x or 0 for x in polled) <= LIVE_EDGE_MS, polled

            wait_js(page, "document.querySelector('#timeline .seg[data-end=\"cut\"]') !== null", "a cut segment")
            segs = s["segments"]
            assert [x["end"] for x in segs[:1]] == ["cut"] and segs[1]["prompt"] == "rivers of glowing molten lava"
            assert segs[1]["ttffMs"] is not None and segs[1]["frames"] > 0

            page.screenshot(path=SCREENSHOT)
            page.click("#start")  # Stop deletes the session
            deadline = time.monotonic() + WAIT_S
            while sid in live_server.manager.sessions and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            assert sid not in live_server.manager.sessions
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=SCREENSHOT)
            raise
        finally:
            browser.close()
    assert page_errors == []


def test_a_segment_picked_in_the_timeline_is_taken_again_and_the_recording_downloads(live_server) -> None:  # type: ignore[no-untyped-def]
    """Record at Start; two finished segments; clicking segment 0 in the timeline and directing takes it again: the
    server answers `retake_of` 0, the page strikes out segments 0 and 1 (abandoned), the new segment plays from
    where segment 0 began; the film and the event log download (the log names the retake)."""
    import json

    _require_chromium()
    from playwright.sync_api import sync_playwright

    page_errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 800, "height": 900}, accept_downloads=True)
        try:
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(live_server.url + "/direct.html")
            page.check("#record")
            page.click("#start")
            sid = wait_js(page, "window.__worldcastDirect.streaming && window.__worldcastDirect.sessionId",
                          "session + stream")
            page.select_option("#duration", "2")
            for n, prompt in enumerate(("a green meadow", "a snowy landscape at dusk")):
                page.fill("#direction", prompt)
                page.click("#direct")
                wait_js(page, f"document.querySelector('#timeline .seg[data-segment=\"{n}\"][data-end=\"finished\"]')"
                              " !== null", f"segment {n} finished")
            page.click('#timeline .seg[data-segment="0"]')
            assert page.text_content("#direct") == "Take 0 again"
            assert page.input_value("#direction") == "a green meadow", "the segment's own prompt is offered"
            page.click("#direct")
            wait_js(page, "window.__worldcastDirect.segments.length === 3 && "
                          "window.__worldcastDirect.segments[2].frames >= 5", "the retake plays")
            segs = page.evaluate("window.__worldcastDirect.segments")
            assert [(s["segment"], s["retakeOf"], s["abandoned"]) for s in segs] == [
                (0, None, True), (1, None, True), (2, 0, False)], segs
            assert page.evaluate("document.querySelectorAll('#timeline .seg.abandoned').length") == 2
            assert page.text_content("#direct") == "Direct" and page.evaluate("window.__worldcastDirect.errors") == []
            page.screenshot(path="/tmp/worldcast_directing_retake.png")

            with page.expect_download() as d:
                page.click("#download")
            log = [json.loads(x) for x in Path(d.value.path()).read_text().splitlines()]
            assert log[0]["session_id"] == sid and log[0]["mode"] == "directing"
            assert [e["segment"] for e in log if e["type"] == "retake"] == [0]
            with page.expect_download() as d:
                page.click("#download-film")
            film = Path(d.value.path()).read_bytes()
            assert d.value.suggested_filename == f"{sid}.mp4" and film[4:8] == b"ftyp" and b"moof" in film
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path="/tmp/worldcast_directing_retake.png")
            raise
        finally:
            browser.close()
    assert page_errors == []
