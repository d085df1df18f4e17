"""The demo page in headless Chromium (Debian's package, driven by Playwright) against a real server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from worldcast.transport.config import DEFAULT_STATIC_DIR

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def wait_js(page, expr: str, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    page.wait_for_function(expr, timeout=timeout_s * 1000)
    return page.evaluate(expr)


def test_demo_connects_plays_and_applies_a_key_press(live_server) -> None:  # type: ignore[no-untyped-def]
    assert (Path(DEFAULT_STATIC_DIR) / "index.html").exists(), "build the demo first: make demo"
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("Chromium missing in CI")
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(live_server.url + "/")
            page.click("#connect")
            wait_js(page, "window.__worldcast.connected && window.__worldcast.framesReceived >= 10")
            # the <video> really plays: its clock advances and frames get painted
            t0 = page.evaluate("document.getElementById('video').currentTime")
            time.sleep(1.0)
            t1 = page.evaluate("document.getElementById('video').currentTime")
            assert t1 > t0, (t0, t1)
            assert page.evaluate("document.getElementById('video').videoWidth") > 0
            applied_before = page.evaluate("window.__worldcast.lastAppliedSeq")
            page.keyboard.down("d")
            sent = wait_js(page, "window.__worldcast.lastSentSeq >= 0 && window.__worldcast.lastSentSeq")
            applied = wait_js(page, f"window.__worldcast.lastAppliedSeq >= {sent} && window.__worldcast.lastAppliedSeq")
            page.keyboard.up("d")
            assert applied >= sent > applied_before
            assert page.evaluate("window.__worldcast.lagMs") is not None
            page.screenshot(path="/tmp/worldcast_demo.png")
        finally:
            browser.close()
    assert errors == []
