"""The Dreamverse-compatible endpoint (WS /ws) driven by a scripted client sending what Dreamverse's client sends.

The script follows FastVideo apps/dreamverse/web/src/app/page.tsx: open /ws, send session_init_v2 at once, then
append_prompt, set_generation_paused and leave; it reads the fields that client's reducer reads.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import av
import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, _serve, server_config

pytestmark = pytest.mark.timeout(240)

SEGMENT_S = 1.0


@pytest.fixture(scope="module")
def dv_server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    yield from _serve(server_config(dreamverse_segment_s=SEGMENT_S), model)


class Script:
    """A scripted Dreamverse client: everything received, in order, with a way to wait for a message."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.msgs: list[dict[str, Any] | bytes] = []
        self._changed = asyncio.Event()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for m in self.ws:
            self.msgs.append(m if isinstance(m, bytes) else json.loads(m))
            self._changed.set()

    async def send(self, obj: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(obj if isinstance(obj, str | bytes) else json.dumps(obj))

    def index(self, pred: Callable[[dict[str, Any]], bool], start: int = 0) -> int | None:
        for i in range(start, len(self.msgs)):
            m = self.msgs[i]
            if isinstance(m, dict) and pred(m):
                return i
        return None

    async def wait(self, pred: Callable[[dict[str, Any]], bool], start: int = 0, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        while (i := self.index(pred, start)) is None:
            assert not self.reader.done(), f"socket closed; got {self.types()[-12:]}"
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), max(0.01, deadline - time.monotonic()))
        return i

    def types(self, start: int = 0) -> list[str]:
        return ["<binary>" if isinstance(m, bytes) else m.get("type", "?") for m in self.msgs[start:]]


def of(kind: str, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m.get("type") == kind and all(m.get(k) == v for k, v in fields.items())


def check_segment(s: Script, idx: int) -> tuple[list[bytes], dict[str, Any]]:
    """A segment's messages come in Dreamverse's order, and its fMP4 plays on its own."""
    start = s.index(of("ltx2_segment_start", segment_idx=idx))
    init = s.index(of("media_init", segment_idx=idx))
    done = s.index(of("media_segment_complete", segment_idx=idx))
    step = s.index(of("step_complete"), done or 0)
    complete = s.index(of("ltx2_segment_complete", segment_idx=idx))
    assert None not in (start, init, done, step, complete), s.types()
    assert start < init < done < step < complete  # type: ignore[operator]
    blobs = [m for m in s.msgs[init:done] if isinstance(m, bytes)]  # type: ignore[misc]
    meta = s.msgs[init]
    assert isinstance(meta, dict) and meta["mode"] == "av_fmp4" and meta["mime"].startswith('video/mp4; codecs="avc1.')
    assert s.msgs[done]["stream_id"] == meta["stream_id"] and s.msgs[done]["chunks"] == len(blobs)  # type: ignore[index]
    with av.open(io.BytesIO(b"".join(blobs))) as c:
        frames = list(c.decode(video=0))
    assert len(frames) == len(blobs) - 1 >= 1, "init segment + one media segment per frame, all decodable"
    assert all(b.pts > a.pts for a, b in zip(frames, frames[1:]))
    return blobs, s.msgs[complete]  # type: ignore[return-value]


async def test_a_dreamverse_client_gets_its_events_in_order_and_playable_segments(dv_server) -> None:  # type: ignore[no-untyped-def]
    url = "ws" + dv_server.url.removeprefix("http") + "/ws"
    async with connect(url, compression=None, max_size=2**24) as ws:
        s = Script(ws)
        await s.wait(of("queue_status"))
        assert s.msgs[0] == {"type": "queue_status", "position": 0, "total_gpus": 1, "available_gpus": 1}
        await s.send({"type": "session_init_v2", "preset_id": "p1", "preset_label": "Test",
                      "curated_prompts": ["a green meadow", "  ", "a snowy landscape"], "initial_rollout_prompt": "",
                      "initial_image": None, "single_clip_mode": False, "enhancement_enabled": False,
                      "auto_extension_enabled": False, "loop_generation_enabled": False})
        gpu = s.msgs[await s.wait(of("gpu_assigned"))]
        assert gpu["gpu_id"] == 0 and gpu["session_timeout"] > 0  # type: ignore[index]
        start = s.msgs[await s.wait(of("ltx2_stream_start"))]
        assert start["total_segments"] == 2 and start["stream_mode"] == "av_fmp4" and start["preset_id"] == "p1"  # type: ignore[index]
        assert "cuts the current segment" in start["worldcast"]["new_prompt"]  # type: ignore[index]

        # segment 1 plays to its end, then segment 2 (the next curated prompt) starts
        await s.wait(of("ltx2_segment_complete", segment_idx=1))
        _, c1 = check_segment(s, 1)
        assert c1["cut"] is False and c1["frames"] == round(SEGMENT_S * 20)
        seg2 = s.msgs[await s.wait(of("ltx2_segment_start", segment_idx=2))]
        assert seg2["prompt"] == "a snowy landscape" and seg2["source"] == "curated" and seg2["seed_prompt_index"] == 1  # type: ignore[index]

        # a new prompt mid-segment cuts segment 2 now (Dreamverse would queue it until the segment ends)
        await s.wait(lambda m: m.get("type") == "media_init" and m.get("segment_idx") == 2)
        await s.send({"type": "append_prompt", "prompt_id": "u1", "prompt": "rivers of glowing molten lava"})
        rec = s.msgs[await s.wait(of("prompt_received", prompt_id="u1"))]
        assert rec["queue_depth"] == 0 and rec["worldcast"]["applies"] == "now"  # type: ignore[index]
        await s.wait(of("ltx2_segment_complete", segment_idx=2))
        _, c2 = check_segment(s, 2)
        assert c2["cut"] is True and c2["frames"] < round(SEGMENT_S * 20)
        seg3 = s.msgs[await s.wait(of("ltx2_segment_start", segment_idx=3))]
        assert seg3["prompt"] == "rivers of glowing molten lava" and seg3["source"] == "user_raw"  # type: ignore[index]
        assert s.index(of("segment_prompt_source", segment_idx=3, prompt_id="u1")) is not None
        await s.wait(of("prompt_ready", prompt_id="u1"))

        # bad input: an error event each, the stream goes on
        mark = len(s.msgs)
        for bad, code in [({"type": "teleport"}, "unknown_type"), ({"type": "simple_generate"}, "unsupported"),
                          ({"type": "rewrite_seed_prompts", "rewrite_instruction": 5}, "bad_message"),
                          ("{nope", "bad_json"), (b"\x00\x01", "binary_not_accepted"),
                          ({"type": "append_prompt", "prompt": "   "}, "bad_prompt"),
                          ({"type": "set_generation_paused", "paused": "yes"}, "bad_message")]:
            await s.send(bad)
            i = await s.wait(of("error", error_code=code), mark)
            assert s.msgs[i]["message"], s.msgs[i]  # type: ignore[index]

        # pause takes effect at the next step: media stops, the segment stays open; resume finishes it
        await s.wait(lambda m: m.get("type") == "media_init" and m.get("segment_idx") == 3)
        await s.send({"type": "set_generation_paused", "paused": True})
        ack = await s.wait(of("generation_paused_updated", paused=True))
        quiet_since, n = time.monotonic(), len(s.msgs)
        deadline = time.monotonic() + 15
        while time.monotonic() - quiet_since < 1.0:  # wait for 1 s without media (bounded)
            assert time.monotonic() < deadline, "media kept coming after the pause"
            await asyncio.sleep(0.05)
            if len(s.msgs) != n:
                quiet_since, n = time.monotonic(), len(s.msgs)
        if s.index(of("ltx2_segment_complete", segment_idx=3), ack) is None:
            await s.send({"type": "set_generation_paused", "paused": False})
            await s.wait(of("generation_paused_updated", paused=False))
        await s.wait(of("ltx2_segment_complete", segment_idx=3))
        check_segment(s, 3)
        await s.wait(of("prompt_sources_blocked", segment_idx=4))  # nothing left to play: it waits

        await s.send({"type": "leave"})
        await s.wait(of("ltx2_stream_complete"))
        await asyncio.wait_for(s.reader, 10)
        assert ws.close_code == 1000
    deadline = time.monotonic() + 10
    while dv_server.manager.sessions and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not dv_server.manager.sessions, "the socket's session closes with it"


async def test_messages_before_init_get_an_error_and_init_still_works(dv_server) -> None:  # type: ignore[no-untyped-def]
    url = "ws" + dv_server.url.removeprefix("http") + "/ws"
    async with connect(url, compression=None) as ws:
        s = Script(ws)
        await s.wait(of("queue_status"))
        await s.send({"type": "append_prompt", "prompt": "too early"})
        await s.wait(of("error", error_code="not_initialized"))
        await s.send({"type": "session_init_v2", "curated_prompts": [], "initial_rollout_prompt": "a green meadow"})
        start = s.msgs[await s.wait(of("ltx2_stream_start"))]
        assert start["total_segments"] == 6  # a custom start: its prompt, rewritten by rule into 6 seeds  # type: ignore[index]
        await s.wait(of("media_init", segment_idx=1))
        await s.send({"type": "session_init_v2", "curated_prompts": ["again"]})
        await s.wait(of("error", error_code="already_initialized"))
        # restart_generation: the curated prompts again from the first, segment numbers from 1, scene kept
        mark = len(s.msgs)
        await s.send({"type": "restart_generation"})
        await s.wait(of("generation_restarted"), mark)
        again = await s.wait(of("ltx2_stream_start", loop_iteration=2), mark)
        cut = await s.wait(of("ltx2_segment_complete", segment_idx=1), mark)
        first = await s.wait(of("ltx2_segment_start", segment_idx=1, prompt="a green meadow"), mark)
        assert s.msgs[cut]["cut"] is True and cut < again < first, s.types(mark)  # type: ignore[index]
        init = await s.wait(of("media_init", segment_idx=1), first)
        assert s.msgs[init]["stream_id"].endswith("-2-1")  # type: ignore[index]


async def test_a_burst_of_prompts_is_each_acknowledged_or_refused_never_both(dv_server) -> None:  # type: ignore[no-untyped-def]
    """30 prompts at once against a budget of bursts of 20: each prompt_id gets exactly one answer, a
    `prompt_received` (queued) or a `rate_limited` refusal naming it (the first refusal of a half-second at
    once, the rest in one summary's `ids`, never one error per refusal); pause toggles share the budget."""
    url = "ws" + dv_server.url.removeprefix("http") + "/ws"
    async with connect(url, compression=None, max_size=2**24) as ws:
        s = Script(ws)
        await s.wait(of("queue_status"))
        await s.send({"type": "session_init_v2", "curated_prompts": ["a green meadow"]})
        await s.wait(of("media_init", segment_idx=1))
        mark = len(s.msgs)
        ids = [f"b{i}" for i in range(30)]
        for pid in ids:
            await s.send({"type": "append_prompt", "prompt_id": pid, "prompt": f"a snowy landscape {pid}"})

        def answers(pid: str) -> list[str]:
            out = []
            for m in s.msgs[mark:]:
                if not isinstance(m, dict):
                    continue
                if m.get("type") == "prompt_received" and m.get("prompt_id") == pid:
                    out.append("received")
                elif m.get("type") == "error" and pid in (m.get("ids") or []):
                    out.append(m["error_code"])
            return out

        deadline = time.monotonic() + 30
        while any(not answers(pid) for pid in ids):
            assert time.monotonic() < deadline, [pid for pid in ids if not answers(pid)]
            await s.wait(lambda m: m.get("type") in ("prompt_received", "error"), len(s.msgs), timeout_s=30)
        kinds = {pid: answers(pid) for pid in ids}
        assert all(len(k) == 1 for k in kinds.values()), kinds  # one answer each, never both
        refused = [pid for pid, k in kinds.items() if k == ["rate_limited"]]
        assert refused and len(refused) + sum(k == ["received"] for k in kinds.values()) == 30, kinds
        errors = [m for m in s.msgs[mark:] if isinstance(m, dict) and m.get("type") == "error"]
        assert len(errors) <= 2 and sum(m["count"] for m in errors) == len(refused), errors  # coalesced
        # pause toggles share the budget: a burst of 30 is partly refused, the refusals counted in summaries
        mark = len(s.msgs)
        for i in range(30):
            await s.send({"type": "set_generation_paused", "paused": i % 2 == 0})

        def toggles() -> tuple[int, int]:
            done = sum(1 for m in s.msgs[mark:] if isinstance(m, dict) and m.get("type") == "generation_paused_updated")
            refused = sum(m["count"] for m in s.msgs[mark:] if isinstance(m, dict) and m.get("type") == "error"
                          and m.get("request") == "set_generation_paused")
            return done, refused

        while sum(toggles()) < 30:
            await s.wait(lambda m: True, len(s.msgs), timeout_s=30)  # the next message
        assert toggles()[1] > 0 and sum(toggles()) == 30, toggles()
        await s.send({"type": "leave"})
        await s.wait(of("ltx2_stream_complete"))
