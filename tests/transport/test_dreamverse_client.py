"""The shipped Dreamverse web client's message sequences, replayed against a live server's WS /ws.

Each sequence is what FastVideo apps/dreamverse/web/src/app/page.tsx sends (`buildProjectInitPayload`,
`submitLivePrompt` in the default composer, `handleStartNewProject` -> `sendEndProjectKeepSession`,
`joinSession` -> `sendProjectInitMessage`, `leaveSession` -> closing the socket) and each wait is for a reply
its reducer (`web/src/lib/ws/reducer.ts`) acts on. None may get an `error`.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, _serve, server_config
from tests.transport.test_dreamverse import Script, check_segment, of

pytestmark = pytest.mark.timeout(240)

CAP = 2  #: segments per rollout on this server
#: the client pads a rewrite's window to 6 prompts with this (promptWindowSnapshot.ts); ours, same role
FILL = "The scene carries on in the same way."
EDIT = "the fox starts to run"  #: the composer's edit in the replay


@pytest.fixture(scope="module")
def dv(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    yield from _serve(server_config(dreamverse_segment_s=1.0, dreamverse_segment_cap=CAP), model)


def init_payload(kind: str, *, curated: list[str], initial: str = "") -> dict[str, Any]:
    """`buildProjectInitPayload(kind)` (a custom start sends no curated prompts and its initial prompt)."""
    return {"type": kind, "preset_id": "custom_editable" if initial else "harbor_dawn",
            "preset_label": "Custom rollout" if initial else "Harbor at dawn", "curated_prompts": curated,
            "initial_rollout_prompt": initial, "initial_image": None, "single_clip_mode": False,
            "enhancement_enabled": True, "auto_extension_enabled": False, "loop_generation_enabled": False}


def no_errors(s: Script) -> None:
    errors = [m for m in s.msgs if isinstance(m, dict) and m.get("type") == "error"]
    assert not errors, errors


def ws_url(server: LiveServer) -> str:
    return "ws" + server.url.removeprefix("http") + "/ws"


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_custom_start_composer_rewrite_new_project_and_leave(dv) -> None:  # type: ignore[no-untyped-def]
    # probeBackendReadiness: /healthz, /readyz, then the socket
    assert get_json(dv.url + "/healthz") == (200, {"status": "ok", "service": "worldcast"})
    assert (await asyncio.to_thread(get_json, dv.url + "/readyz"))[0] == 200
    async with connect(ws_url(dv), compression=None, max_size=2**24) as ws:
        s = Script(ws)
        await s.wait(of("queue_status"))
        # 1. a custom-prompt start: no curated prompts, the typed prompt as initial_rollout_prompt
        await s.send(init_payload("session_init_v2", curated=[], initial="a red fox walking through a snowy forest"))
        order = ["gpu_assigned", "loop_generation_updated", "generation_paused_updated",
                 "rewrite_seed_prompts_started", "seed_prompts_updated", "rewrite_seed_prompts_complete",
                 "generation_paused_updated", "ltx2_stream_start", "seed_prompts_reset_applied"]
        await s.wait(of("ltx2_segment_start", segment_idx=1))
        assert s.types(1)[:len(order)] == order, s.types()
        paused = [m["paused"] for m in s.msgs if isinstance(m, dict) and m["type"] == "generation_paused_updated"]
        assert paused == [True, False]  # paused while the rollout is written, then running
        seeds = s.msgs[s.index(of("seed_prompts_updated"))]
        assert seeds["reason"] == "rewrite" and seeds["prompts"][0] == "a red fox walking through a snowy forest"  # type: ignore[index]
        seg1 = s.msgs[s.index(of("ltx2_segment_start", segment_idx=1))]
        assert seg1["prompt"] == seeds["prompts"][0] and seg1["seed_prompt_index"] == 0  # type: ignore[index]
        await s.wait(of("media_init", segment_idx=1))

        # 2. the default composer's next prompt: rewrite_seed_prompts with the padded prompt window
        mark = len(s.msgs)
        window = [*seeds["prompts"][:1], FILL]  # type: ignore[index]
        await s.send({"type": "rewrite_seed_prompts", "rewrite_instruction": EDIT,
                      "prompt_window_prompts": window + [FILL] * 4})
        done = await s.wait(of("rewrite_seed_prompts_complete"), mark)
        upd = s.msgs[s.index(of("seed_prompts_updated", reason="rewrite"), mark)]
        assert upd["prompts"] == [EDIT] * 6  # type: ignore[index]  # every prompt of the window is the edit
        assert s.index(of("rewrite_seed_prompts_started"), mark) < done  # type: ignore[operator]
        cut = await s.wait(of("ltx2_segment_complete", segment_idx=1), mark)
        start = await s.wait(of("ltx2_stream_start", loop_iteration=2), mark)
        reset = await s.wait(of("seed_prompts_reset_applied", reason="rewrite_during_generation"), mark)
        first = await s.wait(of("ltx2_segment_start", segment_idx=1, prompt=EDIT), mark)
        assert s.msgs[cut]["cut"] is True and cut < start < reset < first, s.types(mark)  # type: ignore[index]
        c = s.msgs[cut]
        assert c["frames"] == len(check_segment(s, 1)[0]) - 1 and c["dropped"] >= 0  # type: ignore[index]
        init2 = await s.wait(of("media_init", segment_idx=1), first)
        assert s.msgs[init2]["stream_id"].endswith("-2-1")  # type: ignore[index]
        # every segment after the edit plays it: the rest of this rollout, up to its cap ...
        capped = await s.wait(of("ltx2_stream_complete"), start)
        played = [m for m in s.msgs[start:capped] if isinstance(m, dict) and m["type"] == "ltx2_segment_start"]
        assert [m["segment_idx"] for m in played] == list(range(1, CAP + 1)), s.types(start)
        assert all(m["prompt"] == EDIT for m in played), [m["prompt"] for m in played]
        # ... and the rollout after the cap (the page's "restart"), which plays the seeds again
        mark = len(s.msgs)
        await s.send({"type": "restart_generation"})
        start = await s.wait(of("ltx2_stream_start", loop_iteration=3), mark)
        await s.wait(of("ltx2_segment_start", segment_idx=CAP), start)
        played = [m for m in s.msgs[start:] if isinstance(m, dict) and m["type"] == "ltx2_segment_start"]
        assert [m["prompt"] for m in played] == [EDIT] * len(played) and len(played) >= CAP, played

        # 3. "New project": end_project_keep_session; the page waits for project_idle
        mark = len(s.msgs)
        await s.send({"type": "end_project_keep_session"})
        idle = await s.wait(of("project_idle"), mark)
        complete = s.index(of("ltx2_stream_complete"), start)  # at the end (or at the cap, if it came first)
        assert complete is not None and complete < idle, s.types(mark)
        assert s.index(of("ltx2_segment_complete"), start) < complete  # type: ignore[operator]
        await asyncio.sleep(1.0)  # nothing plays until the next project
        assert all(isinstance(m, dict) for m in s.msgs[idle:]), s.types(idle)
        # ... then project_init_v1 from a preset: a new project on the same session
        mark = len(s.msgs)
        preset = ["a quiet harbor before sunrise", "gulls circle above moored fishing boats"]
        await s.send(init_payload("project_init_v1", curated=preset))
        start = await s.wait(of("ltx2_stream_start", loop_iteration=1), mark)
        assert s.msgs[start]["total_segments"] == 2  # type: ignore[index]
        await s.wait(of("seed_prompts_updated", reason="init", prompts=preset), start)
        seg = await s.wait(of("ltx2_segment_start", segment_idx=1, prompt=preset[0]), mark)
        await s.wait(of("media_init", segment_idx=1), seg)
        no_errors(s)
        assert len(dv.manager.sessions) == 1

    # 4. leave: the page closes its socket; the session goes with it
    deadline = time.monotonic() + 10
    while dv.manager.sessions and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not dv.manager.sessions
    # every frame of those streams was counted in /metrics (sent, or dropped with a reason)
    with urllib.request.urlopen(dv.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    sent = [ln for ln in text.splitlines() if ln.startswith('worldcast_stream_frames_total{outcome="sent"}')]
    assert sent and float(sent[0].split()[-1]) > 0, sent


async def test_the_segment_cap_ends_the_rollout_and_restart_starts_another(dv) -> None:  # type: ignore[no-untyped-def]
    async with connect(ws_url(dv), compression=None, max_size=2**24) as ws:
        s = Script(ws)
        await s.send(init_payload("session_init_v2", curated=["a green meadow", "a snowy landscape", "a desert"]))
        start = s.msgs[await s.wait(of("ltx2_stream_start"))]
        assert start["generation_segment_cap"] == CAP  # type: ignore[index]
        await s.wait(of("seed_prompts_updated", reason="init"))
        # a user prompt: received, enhancing, ready, then its segment (the client's order)
        await s.wait(of("media_init", segment_idx=1))
        await s.send({"type": "append_prompt", "prompt_id": "p1", "prompt": "a herd of deer crosses the meadow"})
        src = await s.wait(of("segment_prompt_source", prompt_id="p1"))
        steps = [s.index(of(t, prompt_id="p1")) for t in ("prompt_received", "prompt_enhancing", "prompt_ready")]
        assert None not in steps and steps == sorted(steps) and steps[-1] < src, s.types()  # type: ignore[type-var,operator]
        # segment 2 (the prompt) is the cap's last: when it ends the rollout is complete
        done = await s.wait(of("ltx2_stream_complete"))
        assert s.index(of("ltx2_segment_complete", segment_idx=2)) < done  # type: ignore[operator]
        assert s.index(of("ltx2_segment_start", segment_idx=3)) is None
        no_errors(s)
        mark = len(s.msgs)
        await s.send({"type": "append_prompt", "prompt_id": "p2", "prompt": "more deer"})
        await s.wait(of("error", error_code="segment_cap_reached"), mark)
        assert s.index(of("prompt_received", prompt_id="p2"), mark) is None
        # restart_generation: the seeds again from the first, a new rollout
        mark = len(s.msgs)
        await s.send({"type": "restart_generation"})
        await s.wait(of("generation_restarted", segment_cap=CAP), mark)
        again = await s.wait(of("ltx2_stream_start", loop_iteration=2), mark)
        await s.wait(of("seed_prompts_reset_applied", reason="cap_restart"), again)
        await s.wait(of("ltx2_segment_start", segment_idx=1, prompt="a green meadow"), again)


async def test_toggles_resets_and_bad_messages(dv) -> None:  # type: ignore[no-untyped-def]
    async with connect(ws_url(dv), compression=None, max_size=2**24) as ws:
        s = Script(ws)
        await s.send(init_payload("session_init_v2", curated=["a green meadow", "a snowy landscape"]))
        await s.wait(of("media_init", segment_idx=1))
        for kind, ack in [("set_loop_generation", "loop_generation_updated"),
                          ("set_auto_extension", "auto_extension_updated"),
                          ("set_enhancement", "enhancement_updated")]:
            await s.send({"type": kind, "enabled": True})
            await s.wait(of(ack, enabled=True))
        await s.send({"type": "set_rewrite_model", "rewrite_model": "x"})
        await s.wait(of("rewrite_model_updated", rewrite_model="worldcast-rules"))
        mark = len(s.msgs)
        await s.send({"type": "reset_to_seed_prompts"})
        await s.wait(of("seed_prompts_reset_pending", seed_prompt_count=2), mark)
        await s.wait(of("seed_prompts_reset_applied", reason="manual_reset", loop_iteration=2), mark)
        await s.wait(of("ltx2_segment_start", segment_idx=1, prompt="a green meadow", loop_iteration=2), mark)
        no_errors(s)
        # bad messages: a precise error each, and nothing changes (no rewrite starts, no new project)
        mark = len(s.msgs)
        for bad, code in [({"type": "set_loop_generation", "enabled": "yes"}, "bad_message"),
                          ({"type": "rewrite_seed_prompts", "prompt_window_prompts": "a, b"}, "bad_prompt"),
                          ({"type": "rewrite_seed_prompts", "prompt_window_prompts": ["ok", "bad\x07"]}, "bad_prompt"),
                          ({"type": "rewrite_seed_prompts", "rewrite_instruction": ["x"]}, "bad_message"),
                          (init_payload("project_init_v1", curated=["x"]), "project_active"),
                          ({"type": "select_model"}, "unsupported")]:
            await s.send(bad)
            i = await s.wait(of("error", error_code=code), mark)
            assert s.msgs[i]["message"], s.msgs[i]  # type: ignore[index]
            mark = i + 1
        assert s.index(of("rewrite_seed_prompts_started")) is None
        assert s.index(of("ltx2_stream_start", loop_iteration=1, total_segments=1)) is None
        # once the project ended, prompts are refused until project_init_v1
        await s.send({"type": "end_project_keep_session"})
        await s.wait(of("project_idle"))
        mark = len(s.msgs)
        await s.send({"type": "append_prompt", "prompt_id": "late", "prompt": "too late"})
        await s.wait(of("error", error_code="no_project"), mark)
        await s.send({"type": "end_project_keep_session"})  # again: answered again, no error
        await s.wait(of("project_idle"), mark)
        assert s.index(of("prompt_received", prompt_id="late"), mark) is None


def test_the_clients_http_reads(dv) -> None:  # type: ignore[no-untyped-def]
    code, st = get_json(dv.url + "/status")
    assert code == 200 and st["total_gpus"] == 1 and st["warmup_failed_gpus"] == 0 and st["service"] == "worldcast"
    code, cfg = get_json(dv.url + "/prompt-system-config")
    assert code == 200 and all(isinstance(cfg[k], str) and "no language model" in cfg[k] for k in (
        "next_segment_system_prompt", "auto_extension_system_prompt", "rewrite_window_system_prompt"))
    req = urllib.request.Request(dv.url + "/prompt-system-config", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 501 and "no language model" in json.loads(e.value.read())["detail"]
    code, presets = get_json(dv.url + "/curated-presets")
    assert code == 200 and presets["count"] == len(presets["presets"]) >= 1
    for p in presets["presets"]:  # what the client's parseStoryPresets keeps
        assert p["id"].strip() and p["label"].strip() and len(p["segment_prompts"]) >= 2
        assert all(isinstance(x, str) and x.strip() for x in p["segment_prompts"])
