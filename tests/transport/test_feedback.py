"""InputFeedback: coalesced summaries from a timer, one flood verdict, nothing after it; and the WebSocket
stream using it (a flooding stream client gets summaries, then `disconnect`, then a policy close)."""

from __future__ import annotations

import asyncio
import json

from tests.conftest import _serve, server_config  # noqa: F401 - live_server comes from conftest
from worldcast.transport.clients.stream import StreamClient
from worldcast.transport.feedback import InputFeedback
from worldcast.transport.limits import InputGuard, InputLimits


async def test_rejections_are_summarised_by_the_timer_and_a_flood_gets_one_verdict() -> None:
    now = [100.0]
    guard = InputGuard(InputLimits(report_interval_s=0.05, abuse_rejections_per_s=10, abuse_sustained_s=2))
    sent: list[dict] = []  # type: ignore[type-arg]
    floods: list[dict] = []  # type: ignore[type-arg]
    fb = InputFeedback(guard, send=sent.append, on_flood=floods.append, clock=lambda: now[0])
    for _ in range(30):  # a burst of junk inside one interval
        fb.send_all(guard.rejected_action(-32602, "bad", seq=None, now_s=now[0]))
    first = [e for e in sent if e.get("event") == "action_rejected"]
    assert len(first) == 1, "the first rejection is answered at once, the rest wait for the summary"
    now[0] += 0.06
    deadline = asyncio.get_running_loop().time() + 10  # the armed timer fires (bounded, however busy)
    while len([e for e in sent if e.get("event") == "action_rejected"]) < 2:
        assert asyncio.get_running_loop().time() < deadline, "the summary timer never fired"
        await asyncio.sleep(0.01)
    summaries = [e for e in sent if e.get("event") == "action_rejected"]
    assert len(summaries) == 2 and summaries[-1]["count"] == 29
    for second in range(4):  # more than 10 rejections a second, for longer than 2 s
        now[0] = 101.0 + second
        for _ in range(20):
            fb.send_all(guard.rejected_action(-32602, "bad", seq=None, now_s=now[0]))
    assert len(floods) == 1 and floods[0]["event"] == "disconnect" and sent[-1] == floods[0]
    n = len(sent)
    fb.send_all([{"event": "late"}])
    assert fb.closed and len(sent) == n, "nothing is sent after the verdict"


async def test_a_flooding_stream_client_is_told_then_closed(live_server) -> None:  # type: ignore[no-untyped-def]
    c = await StreamClient.connect(live_server.url, seed=9, decode=False)
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 15
        while loop.time() < end and c.closed_code is None:
            for _ in range(40):  # ~400 junk actions a second
                await c.send_raw(json.dumps({"seq": "x", "t": 0}))
            await asyncio.sleep(0.1)  # pacing: bursts of 40 ten times a second
        await asyncio.wait_for(asyncio.shield(c._reader), 10)  # the server closes the socket
        events = [e for e in c.events if e.get("event") in ("action_rejected", "disconnect")]
        rejected = [e for e in events if e["event"] == "action_rejected"]
        assert events and events[-1]["event"] == "disconnect", [e["event"] for e in events][-5:]
        assert len(rejected) < 60, f"{len(rejected)} rejection events: not coalesced"
        assert sum(e.get("count", 1) for e in rejected) > 500
        assert c.closed_code == 1008
    finally:
        await c.aclose()
