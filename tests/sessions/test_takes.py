"""Taking a directing segment again, through the real server over the worldcast stream: the world is put back where
the segment began, so the same direction makes the same frames again (pixel hashes from the session's recording),
another direction makes other ones; the abandoned take's later segments cannot be taken again, a cut segment's
start was never kept, bad requests are refused and change nothing; the recording replays, retake included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.conftest import _serve, server_config
from worldcast.sessions.recording import read_log
from worldcast.sessions.replay import replay
from worldcast.transport.clients import StreamClient
from worldcast.transport.clients.errors import StreamError

pytestmark = pytest.mark.timeout(240)


def _frames_by_epoch(log: Path) -> dict[int, list[str]]:
    """Delivered frames' pixel sha256 by flush epoch (a segment's frames share its epoch), in order."""
    out: dict[int, list[str]] = {}
    for e in read_log(log):
        if e.type == "frame" and e.fields["outcome"] == "delivered":
            out.setdefault(e.fields["epoch"], []).append(e.fields["sha256"])
    return out


async def _segment(c: StreamClient, prompt: str, **kw) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """Direct and wait for the segment to finish; returns its segment_complete."""
    ack = await c.direct(prompt, duration_s=0.4, **kw)
    return await c.wait_event(lambda e: e["event"] == "segment_complete" and e["segment"] == ack["segment"],
                              timeout_s=60)


async def _play(url: str) -> tuple[str, list[dict], dict, dict]:  # type: ignore[type-arg]
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"mode": "directing", "seed": 4, "record": True})
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
    c = await StreamClient.attach(url, sid, token, model=r.json()["model"])
    try:
        done = [await _segment(c, "a green meadow"), await _segment(c, "a snowy landscape at dusk"),
                await _segment(c, "rivers of glowing molten lava")]
        assert [d["end"] for d in done] == ["finished"] * 3
        # segment 1 again with its own direction: a new segment (3) from where 1 began
        ack = await c.direct("a snowy landscape at dusk", duration_s=0.4, from_segment=1)
        assert ack["segment"] == 3 and ack["retake_of"] == 1 and ack["cut"] is None
        again = await c.wait_event(lambda e: e["event"] == "segment_complete" and e["segment"] == 3, timeout_s=60)
        assert again["first_frame_index"] == done[1]["first_frame_index"], "the world went back to segment 1's start"
        # segment 2 was abandoned with its take; it cannot be taken again, and nothing changes
        with pytest.raises(StreamError) as refused:
            await c.direct("anything", from_segment=2)
        assert refused.value.code == "cannot_retake" and "abandoned" in str(refused.value)
        with pytest.raises(StreamError) as refused:
            await c.direct("anything", from_segment=99)
        assert refused.value.code == "cannot_retake" and "no such segment" in str(refused.value)
        with pytest.raises(StreamError) as refused:
            await c.direct("anything", from_segment=-1)
        assert refused.value.code == "bad_direction"
        # taking segment 1 again with another direction: other frames from the same start
        ack = await c.direct("a sandy desert at noon", duration_s=0.4, from_segment=1)
        assert ack["segment"] == 4 and ack["retake_of"] == 1
        other = await c.wait_event(lambda e: e["event"] == "segment_complete" and e["segment"] == 4, timeout_s=60)
        # a cut segment's start is not kept: segment 6 begins with a cut of 5
        await c.direct("a green meadow", open_ended=True)
        await c.next_frame(timeout_s=30)
        await c.direct("a snowy landscape at dusk", open_ended=True)
        await c.next_frame(timeout_s=30)
        with pytest.raises(StreamError) as refused:
            await c.direct("anything", from_segment=6)
        assert refused.value.code == "cannot_retake" and "cut" in str(refused.value)
        segs = [e for e in c.events if e["event"] in ("segment_start",)]
        assert [s["retake_of"] for s in segs] == [None, None, None, 1, 1, None, None]
    finally:
        await c.aclose()
    return sid, done, again, other


def test_a_segment_taken_again_makes_the_same_frames_from_the_same_start(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = server_config()
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        sid, done, again, other = asyncio.run(_play(server.url))
    finally:
        serving.close()
    assert cfg.recordings is not None
    log = cfg.recordings.directory / sid / "events.jsonl"
    by_epoch = _frames_by_epoch(log)
    first, retaken, elsewhere = (by_epoch[done[1]["epoch"]], by_epoch[again["epoch"]], by_epoch[other["epoch"]])
    assert len(first) == len(retaken) == 8 and len(set(first)) > 1, "the world moves within a segment"
    assert retaken == first, "the same direction from the same start makes the same frames"
    assert elsewhere[0] != first[0], "another direction from the same start makes other frames"
    retakes = [e.fields for e in read_log(log) if e.type == "retake"]
    assert [r["segment"] for r in retakes] == [1, 1] and retakes[0]["state_sha256"] == retakes[1]["state_sha256"]
    # the recording replays frame for frame, retakes included
    report = replay(log, model=model)
    assert report.retakes == 2 and report.mismatched == [] and report.exact, report
    delivered = sum(len(v) for v in by_epoch.values())
    assert report.frames >= delivered
