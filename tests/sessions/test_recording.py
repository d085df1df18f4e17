"""Recordings: a session recorded through the real server (HTTP, the fMP4 stream, the engine thread) is generated
again frame for frame by `replay` from its event log; a log that is cut, reordered, edited or of other weights is
refused or reported by line; the recording never takes the session down."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import torch

from tests.conftest import _serve, server_config
from worldcast.sessions.recording import FORMAT, EventLog, RecordingError, read_log, repair_log
from worldcast.sessions.replay import replay
from worldcast.transport.clients.stream import StreamClient


async def _record_a_session(url: str) -> tuple[str, str]:
    """A session made with "record": true and driven for a while: keys, a gamepad axis, a prompt, a flush, a pause
    (an idle gap) and a resume, then closed. Returns its id and token."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"record": True, "seed": 11, "prompt": "a green meadow"})
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        c = await StreamClient.attach(url, sid, token, model=r.json()["model"])
        try:
            for i in range(12):
                await c.send_action(keys=["d"] if i < 8 else ["s", "shift"], axes={"look_x": 0.5} if i % 3 else None)
                await c.next_frame()
            assert (await http.post(f"/v1/sessions/{sid}/rpc", headers=auth,
                                    json={"id": 1, "method": "set_prompt", "params": {"prompt": "molten lava"}})
                    ).status_code == 200
            assert (await http.post(f"/v1/sessions/{sid}/rpc", headers=auth, json={"id": 2, "method": "flush"})
                    ).status_code == 200
            for _ in range(6):
                await c.send_action(keys=["w"])
                await c.next_frame()
            await c.rpc("pause")
            await c.rpc("resume")
            for _ in range(4):
                await c.next_frame()
        finally:
            await c.aclose(delete=False)
        # the log is the session's to read while it lives: not a stranger's
        assert (await http.get(f"/v1/sessions/{sid}/recording/events")).status_code == 401
        assert (await http.get(f"/v1/sessions/{sid}/recording/events",
                               headers={"Authorization": "Bearer nope"})).status_code == 404
        assert (await http.delete(f"/v1/sessions/{sid}", headers=auth)).status_code == 204
        r = await http.get(f"/v1/sessions/{sid}/recording/events", headers=auth)  # and after it closed
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/jsonl")
        lines = [json.loads(x) for x in r.text.splitlines()]
        assert lines[0]["type"] == "header" and lines[-1] == {"type": "end", "t": lines[-1]["t"], "reason": "client"}
        # its video: the session's one encode (shared with the stream above), fragmented MP4 that plays
        r = await http.get(f"/v1/sessions/{sid}/recording", headers=auth)
        assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
        with av.open(io.BytesIO(r.content)) as film:
            pictures = [f.to_ndarray(format="rgb24") for f in film.decode(video=0)]
        delivered = sum(1 for x in lines if x["type"] == "frame" and x["outcome"] == "delivered")
        assert 10 <= len(pictures) <= delivered and pictures[0].shape == (128, 128, 3), (len(pictures), delivered)
    return sid, token


@pytest.fixture(scope="module")
def recorded(model, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The folder of one session recorded through a real server (closed before the tests replay it, so nothing
    else runs on the model meanwhile)."""
    cfg = server_config()
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        sid, _ = asyncio.run(_record_a_session(server.url))
    finally:
        serving.close()
    assert cfg.recordings is not None
    keep = tmp_path_factory.mktemp("recording") / sid
    shutil.copytree(cfg.recordings.directory / sid, keep)
    return keep


def test_the_log_says_what_happened(recorded: Path) -> None:
    events = list(read_log(recorded / "events.jsonl"))
    kinds = [e.type for e in events]
    header = events[0].fields
    assert header["format"] == FORMAT and header["from_start"] and header["seed"] == 11
    assert header["prompt"] == "a green meadow" and len(header["weights_sha256"]) == 64
    for k in ("action", "prompt", "flush", "pause", "resume", "chunk", "frame", "applied", "end"):
        assert k in kinds, k
    actions = [e.fields for e in events if e.type == "action"]
    assert actions[0]["keys"] == ["d"] and any(a["axes"] == {"look_x": 0.5} for a in actions)
    frames = [e.fields for e in events if e.type == "frame"]
    assert [f["index"] for f in frames] == list(range(len(frames))), "every frame the engine made, in order"
    delivered = [f for f in frames if f["outcome"] == "delivered"]
    assert all(b["pts"] > a["pts"] for a, b in zip(delivered, delivered[1:], strict=False))
    prompt = next(e for e in events if e.type == "prompt")
    assert prompt.fields == {"t": prompt.fields["t"], "text": "molten lava", "context_version": 1}
    # which frame each of the video's pictures is: delivered frames, in order, the first naming the upscale
    video = [e.fields for e in events if e.type == "video"]
    assert video and video[0]["scale"] == 2 and video[0]["stamp"] is False
    shown = {f["index"] for f in delivered}
    assert all(v["index"] in shown for v in video) and [v["index"] for v in video] == sorted(v["index"] for v in video)


def test_replay_makes_every_frame_again_exactly(recorded: Path, model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report = replay(recorded / "events.jsonl", model=model, frames_dir=tmp_path / "frames",
                    export_dir=tmp_path / "export")
    frames = [e for e in read_log(recorded / "events.jsonl") if e.type == "frame"]
    assert report.frames == len(frames) and report.mismatched == [] and report.exact, report
    assert report.differences == [] and report.psnr_db == [], "nothing differs: no PSNR to report"
    assert len(list((tmp_path / "frames").glob("frame_*.png"))) == report.frames
    acts = np.load(tmp_path / "export" / "actions.npy")
    assert acts.shape == (report.frames, model.spec.actions.dim) and acts[:, 3].any(), "d was held"


def _rewrite(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    shutil.copytree(src, dst)
    lines = (src / "events.jsonl").read_text().splitlines(keepends=True)
    (dst / "events.jsonl").write_text("".join(edit(lines)), encoding="utf-8", errors="surrogateescape")
    return dst / "events.jsonl"


def test_a_cut_reordered_or_foreign_log_is_refused_by_line(recorded: Path, model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cut = _rewrite(recorded, tmp_path / "cut", lambda ls: [*ls[:-1], ls[-1][:10]])
    with pytest.raises(RecordingError, match=r"line \d+: truncated"):
        replay(cut, model=model)

    def swap_chunks(ls: list[str]) -> list[str]:
        idx = [i for i, x in enumerate(ls) if '"type":"chunk"' in x][1:3]
        ls = list(ls)
        a, b = json.loads(ls[idx[0]]), json.loads(ls[idx[1]])
        a["t"], b["t"] = b["t"], a["t"]  # keep time in order: only the chunks' order is wrong
        ls[idx[0]], ls[idx[1]] = json.dumps(b) + "\n", json.dumps(a) + "\n"
        return ls
    reordered = _rewrite(recorded, tmp_path / "reordered", swap_chunks)
    with pytest.raises(RecordingError, match=r"line \d+: chunk of latent frame \d+ out of order"):
        replay(reordered, model=model)

    def late_start(ls: list[str]) -> list[str]:
        h = json.loads(ls[0])
        h["from_start"] = False
        return [json.dumps(h) + "\n", *ls[1:]]
    with pytest.raises(RecordingError, match="line 1: this recording began after its session started"):
        replay(_rewrite(recorded, tmp_path / "late", late_start), model=model)
    with pytest.raises(RecordingError, match="line 3: unknown event type 'teleport'"):
        replay(_rewrite(recorded, tmp_path / "unknown", lambda ls: [*ls[:2], '{"type":"teleport","t":1}\n', *ls[2:]]),
               model=model)


def test_an_edited_action_or_other_weights_are_reported_frame_by_frame(recorded: Path, model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def edit_actions(ls: list[str]) -> list[str]:
        out, done = [], False
        for x in ls:
            e = json.loads(x)
            if e["type"] == "chunk" and e["actions"] is not None and not done and e["first_latent"] > 2:
                e["actions"] = [[1.0 - v if j < 4 else v for j, v in enumerate(row)] for row in e["actions"]]
                done = True
            if e["type"] == "header":
                e["weights_sha256"] = "0" * 64
            out.append(json.dumps(e) + "\n")
        return out
    report = replay(_rewrite(recorded, tmp_path / "edited", edit_actions), model=model)
    assert not report.exact and report.mismatched and report.identical > 0, report
    assert any("weights" in d for d in report.differences)


def test_a_replay_on_other_weights_reports_psnr_against_the_served_video(recorded: Path) -> None:
    """Where exactness cannot hold (here: other weights), replay names the difference and measures each differing
    frame against the recording's video: weights nudged a little stay close to what was served, weights pushed
    further fall further (so the number measures the frames, not the codec), and a frame the video does not hold
    gets none."""
    from worldcast.models.tinyworld import TinyWorldModel

    def nudged(scale: float) -> TinyWorldModel:
        m = TinyWorldModel.from_pretrained()
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in m.net.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * scale * p.abs().mean())
        return m

    log = recorded / "events.jsonl"
    in_video = {e.fields["index"] for e in read_log(log) if e.type == "video"}
    reports = {s: replay(log, model=nudged(s)) for s in (0.01, 0.3)}
    means = {}
    for s, report in reports.items():
        assert not report.exact and any("weights" in d for d in report.differences), report
        assert report.psnr_db, "the differing frames were measured against the film"
        assert {i for i, _ in report.psnr_db} == set(report.mismatched) & in_video
        values = [v for _, v in report.psnr_db]
        assert all(0 < v < 100 for v in values), values
        means[s] = sum(values) / len(values)
    print(f"\nPSNR against the served video, mean over the differing frames: weights nudged 1%: {means[0.01]:.1f} dB, "
          f"30%: {means[0.3]:.1f} dB")
    assert means[0.01] > means[0.3] + 3, means


def test_the_size_cap_stops_the_recording_not_the_session(tmp_path: Path) -> None:
    stopped: list[str] = []
    log = EventLog(tmp_path / "events.jsonl", {"model": "m", "seed": 0, "from_start": True}, max_bytes=400)
    log.on_stop = stopped.append
    n = 0
    while log.write("pause"):
        n += 1
    assert stopped and "size cap of 400 bytes" in stopped[0] and log.stopped == stopped[0]
    assert not log.write("resume"), "nothing is written after it stopped"
    assert (tmp_path / "events.jsonl").stat().st_size <= 400 and n > 3
    assert [e.type for e in read_log(tmp_path / "events.jsonl")] == ["header"] + ["pause"] * n


def test_a_log_a_killed_server_left_is_repaired_once(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", {"model": "m", "seed": 0, "from_start": True}, max_bytes=10_000)
    log.write("pause")
    log._file.flush()  # type: ignore[union-attr]  # as far as a killed server got
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"type":"resu')
    assert repair_log(tmp_path / "events.jsonl")
    assert [e.type for e in read_log(tmp_path / "events.jsonl")] == ["header", "pause", "end"]
    assert not repair_log(tmp_path / "events.jsonl"), "a log that ends is left alone"


async def _rpcs_and_refusals(url: str, rec_dir: Path) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"seed": 1})
        sid, token, model = r.json()["session_id"], r.json()["token"], r.json()["model"]
        auth = {"Authorization": f"Bearer {token}"}
        c = await StreamClient.attach(url, sid, token, model=model)
        try:
            assert (await c.rpc("record_start")) == {
                "recording": True, "replayable": False, "events": f"/v1/sessions/{sid}/recording/events"}
            with pytest.raises(Exception, match="already recording"):
                await c.rpc("record_start")
            # a viewer of the session cannot read its recording
            v = (await http.post(f"/v1/sessions/{sid}/viewers", headers=auth)).json()
            assert (await http.get(f"/v1/sessions/{sid}/recording/events",
                                   headers={"Authorization": f"Bearer {v['viewer_token']}"})).status_code == 404
            # the size cap (4 KiB here) stops the recording, not the session: its client is told, frames go on
            for _ in range(40):
                await c.send_action(keys=["d"])
                await c.next_frame()
            ev = await c.wait_event(lambda e: e.get("event") == "error" and e.get("code") == "recording_stopped",
                                    timeout_s=30, past=True)
            assert "size cap of 4096 bytes" in ev["message"]
            n = (await c.next_frame()).frame_index
            assert (await c.next_frame()).frame_index > n
            assert (await c.rpc("record_stop")) == {"stopped": False}
            lines = (await http.get(f"/v1/sessions/{sid}/recording/events", headers=auth)).text.splitlines()
            assert json.loads(lines[0])["from_start"] is False and len("".join(lines)) <= 4096
            # the quota (one recording's cap) is taken by the kept one: the next is refused, with the reason
            r = await http.post("/v1/sessions", json={"record": True})
            assert r.status_code == 409 and "quota is full" in r.json()["detail"], r.text
        finally:
            await c.aclose()


def test_record_rpcs_the_size_cap_the_quota_and_a_viewer(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from worldcast.sessions.recording import RecordingConfig

    # the quota holds one live recording at its caps (log and video, 4 KiB each): a second is refused
    cfg = server_config(recordings=RecordingConfig(tmp_path / "rec", max_session_bytes=4096, max_total_bytes=8192))
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        asyncio.run(_rpcs_and_refusals(server.url, tmp_path / "rec"))
        assert len(server.manager.sessions) == 0
    finally:
        serving.close()


def test_a_server_without_recordings_refuses_record_and_keeps_nothing(model) -> None:  # type: ignore[no-untyped-def]
    serving = _serve(server_config(recordings=None), model)
    server = next(serving)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            r = http.post("/v1/sessions", json={"record": True})
            assert r.status_code == 409 and "does not record" in r.json()["detail"]
            assert server.manager.sessions == {}
    finally:
        serving.close()


def test_hostile_logs_are_refused_by_line_never_a_crash(recorded: Path, model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def edit_first_chunk(change):  # type: ignore[no-untyped-def]
        def edit(ls: list[str]) -> list[str]:
            out, done = [], False
            for x in ls:
                e = json.loads(x)
                if e["type"] == "chunk" and e["actions"] is not None and not done:
                    change(e)
                    done = True
                out.append(json.dumps(e) + "\n")
            return out
        return edit

    cases = {
        "nan": (lambda ls: [ls[0], ls[1].replace('"t":', '"t":NaN,"x":', 1), *ls[2:]], "not a number JSON allows"),
        "no_actions": (edit_first_chunk(lambda e: e.pop("actions")), "chunk needs 'actions'"),
        "bad_rows": (edit_first_chunk(lambda e: e.update(actions=[["1"] * 8])), "rows of 8 finite numbers"),
        # a value the live gate could never make reaches no model: huge (it overflowed the model to NaN), or a key
        # pressed twice over
        "huge_action": (edit_first_chunk(lambda e: e["actions"][0].__setitem__(6, 1e308)), "action bounds"),
        "key_twice": (edit_first_chunk(lambda e: e["actions"][-1].__setitem__(0, 2.0)), "action bounds"),
        "huge_int": (edit_first_chunk(lambda e: e["actions"][0].__setitem__(7, 10**400)), "action bounds"),  # the fuzz
        "huge_draws": (edit_first_chunk(lambda e: e.update(draws=10**9)), "draws must lie within"),
        "image_path": (lambda ls: [json.dumps(json.loads(ls[0]) | {"image_sha256": "../../x"}) + "\n", *ls[1:]],
                       "image_sha256 must be 64 hexadecimal digits"),
        "served": (lambda ls: [json.dumps(json.loads(ls[0]) | {"served": "x"}) + "\n", *ls[1:]],
                   "served must be null or an object"),
        "served_dtype": (header_with(served={"dtype": "float8_e4m3fn", "compiled_buckets": [],
                                             "package_buckets": []}), "served must be null or an object"),
        "served_bucket": (header_with(served={"dtype": "float32", "compiled_buckets": [10**9],
                                              "package_buckets": []}), "served must be null or an object"),
        "seed": (header_with(seed=2**70), "seed must be an integer"),
        "device": (header_with(device={"x": [1] * 100}), "device must be text"),
        "long_prompt": (header_with(prompt="p" * 501), "a prompt must be text of 1..500"),
        "deep": (lambda ls: [ls[0], "[" * 100_000 + "]" * 100_000 + "\n", *ls[1:]], "nested too deeply"),
        "long_line": (lambda ls: [ls[0], '{"type":"pause","t":1,"x":"' + "x" * (1 << 21) + '"}\n', *ls[1:]],
                      "longer than"),
        "not_utf8": (lambda ls: [ls[0], "\udcff\n", *ls[1:]], "not UTF-8"),
        "empty": (lambda ls: [], "empty"),
    }
    for name, (edit, said) in cases.items():
        with pytest.raises(RecordingError, match=said):
            replay(_rewrite(recorded, tmp_path / name, edit), model=model)


def header_with(**fields):  # type: ignore[no-untyped-def]
    """An edit of a log's lines that sets `fields` in its header."""
    return lambda ls: [json.dumps(json.loads(ls[0]) | fields) + "\n", *ls[1:]]


def test_replay_opens_no_file_a_log_names(recorded: Path, tmp_path: Path) -> None:
    """A log's weights path is information only: replay loads the recorded model's shipped weights (the same here,
    so every frame is still exact) and opens no file outside the log's folder; a starting image, a snapshot or a
    video that is a link out of the folder is not followed."""
    from tests.fuzz.replay_fuzz import OpenWatch

    outside = tmp_path / "outside.png"
    outside.write_bytes(b"not an image")
    watch = OpenWatch.get()
    for name, path in (("passwd", "/etc/passwd"), ("relative", "../../outside.png"), ("mine", str(outside))):
        log = _rewrite(recorded, tmp_path / name, header_with(weights=path))
        with watch.watching(log.parent) as opened:
            report = replay(log)  # no model given: replay loads it, as the command does
        assert report.exact and report.differences == [], (name, report)
        assert opened == [], opened
    # a starting image that is a link out of the folder
    linked = _rewrite(recorded, tmp_path / "linked", header_with(image_sha256="a" * 64))
    (linked.parent / "images").mkdir()
    (linked.parent / "images" / f"{'a' * 64}.png").symlink_to(outside)
    with watch.watching(linked.parent) as opened, pytest.raises(RecordingError, match="not a file of the log's"):
        replay(linked)
    assert opened == []
    # the film as a link out: replay still runs, and does not read it
    (linked.parent / "video.mp4").unlink()
    (linked.parent / "video.mp4").symlink_to(outside)
    from worldcast.sessions.recording import contained_file

    assert contained_file(linked.parent, "video.mp4") is None
    assert contained_file(linked.parent, "events.jsonl") == linked
    for bad in ("../events.jsonl", "..", "images/x", ""):
        assert contained_file(linked.parent, bad) is None, bad


def test_replay_failures_are_one_line(recorded: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A model that fails on a chunk is named by the chunk's line (exit 2); an internal error is one line with exit
    1 (its traceback only with --debug); a film that cannot be written is one line, exit 2."""
    from worldcast.models.tinyworld import TinyWorldModel
    from worldcast.transport import cli

    class Failing(TinyWorldModel):
        def denoise(self, x_t, t, cond, state):  # type: ignore[no-untyped-def]
            return super().denoise(x_t, t, cond, state) * float("nan")

    with pytest.raises(RecordingError, match=r"line \d+: the model failed on this chunk"):
        replay(recorded / "events.jsonl", model=Failing.from_pretrained())

    def run(*argv: str) -> tuple[int, str]:
        code = cli.replay_command(cli.build_parser().parse_args(["replay", *argv]))
        return code, capsys.readouterr().err

    code, err = run(str(recorded / "events.jsonl"), "--out", str(tmp_path / "no" / "such" / "dir" / "film.mp4"))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and "film.mp4" in err, err

    import worldcast.sessions.replay as replay_module

    def broken(*a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug")

    original = replay_module.replay
    replay_module.replay = broken
    try:
        code, err = run(str(recorded / "events.jsonl"))
        assert code == 1 and err.count("\n") == 1 and "internal error: RuntimeError: a bug" in err, err
        code, err = run(str(recorded / "events.jsonl"), "--debug")
        assert code == 1 and "Traceback" in err and "a bug" in err, err
    finally:
        replay_module.replay = original


@pytest.mark.timeout(600)
def test_a_small_fuzz_of_recorded_logs_never_crashes_replay(recorded: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Mutations of a real log (every field type, cuts, huge and non-finite numbers, duplicated and moved lines,
    links out of the folder): each replays or is refused, none raises anything else or opens a file outside its
    folder. `make fuzz` runs 10,000."""
    from tests.fuzz.replay_fuzz import fuzz_replay

    res = fuzz_replay(recorded, model, 150, seed=1)
    assert res.cases == 150 and res.crash_count == 0, res.crashes
    refusals = [k for k in res.outcomes if k.startswith("refused")]
    assert len(refusals) >= 5 and res.outcomes["exact"] > 0, res.outcomes


def test_a_new_server_touches_only_recordings_it_may(tmp_path: Path) -> None:
    """Start-up repairs a cut log of a recording folder and deletes an old one; a folder that is not a recording's
    (no token file, or not a session id's name) is never touched; a second server over the same directory leaves
    everything as it is."""
    import os
    import time as _time

    from worldcast.sessions.recording import RecordingConfig, Recordings

    d = tmp_path / "rec"
    cut, old, stranger, odd = d / ("a" * 16), d / ("b" * 16), d / "photos", d / ("c" * 16)
    for f in (cut, old, stranger, odd):
        f.mkdir(parents=True)
        (f / "events.jsonl").write_text('{"type":"header","t":0}\n{"type":"pau')
    for f in (cut, old):
        (f / "token.sha256").write_text("0" * 64)
    os.utime(old / "events.jsonl", (_time.time() - 7200, _time.time() - 7200))
    first = Recordings(RecordingConfig(d, retention_s=3600), identity={})
    assert (cut / "events.jsonl").read_text().endswith('"reason":"server_stopped"}\n') and not old.exists()
    assert (stranger / "events.jsonl").read_text().endswith('"pau') and (odd / "events.jsonl").exists()
    (cut / "events.jsonl").write_text('{"type":"header","t":0}\n{"type":"pau')
    Recordings(RecordingConfig(d, retention_s=3600), identity={})  # another server: the lock is held
    assert (cut / "events.jsonl").read_text().endswith('"pau'), "a directory another server holds is left alone"
    assert first.kept == {cut.name: first.kept[cut.name]}


def test_a_frame_an_engine_process_dropped_on_a_full_ring_keeps_its_chunk_record_and_place(
        recorded: Path, model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import types

    from worldcast.engine.process.client import frames_from
    from worldcast.engine.process.main import EngineProcessCore
    from worldcast.engine.process.shm_frames import ShmFrameRing
    from worldcast.engine.step_output import ChunkRecord, FrameOut
    from worldcast.sessions.frames import FramePipeline

    record = ChunkRecord(first_latent=4, draws=1, cached_version=0, context_version=0,
                         actions=np.zeros((1, 6), np.float32))
    made = [FrameOut("s", 3, np.full((2, 2, 3), 9, np.uint8), 0.0, 1, 0),
            FrameOut("s", 4, np.full((2, 2, 3), 7, np.uint8), 0.0, 1, 0, chunk=record)]
    ring = ShmFrameRing.create(slots=1, slot_bytes=12)  # one slot: the second frame finds the ring full
    sent: list[object] = []
    try:
        core = types.SimpleNamespace(ring=ring, out=types.SimpleNamespace(send=sent.append),
                                     spec=types.SimpleNamespace(engine_id=0))
        EngineProcessCore._on_frames(core, made)  # type: ignore[arg-type]
        assert len(sent) == 1 and ring.dropped == 1
        got = frames_from(sent[0].frames, ring)  # type: ignore[attr-defined]
    finally:
        ring.close()
    assert [f.lost for f in got] == [False, True] and got[1].chunk == record and got[1].frame_index == 4
    assert np.array_equal(got[0].image, made[0].image)

    pipeline = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.0, clock=lambda: 0.0)
    log = EventLog(tmp_path / "events.jsonl", {"model": "m", "seed": 0, "from_start": True}, max_bytes=2**20)
    pipeline.on_generated = log.frame
    delivered: list[object] = []
    pipeline.on_delivered.append(delivered.append)
    for f in got:
        pipeline.deliver(f)
    log.close("client")
    assert len(delivered) == 1 and pipeline.dropped_lost == 1
    events = list(read_log(tmp_path / "events.jsonl"))
    assert [e.type for e in events] == ["header", "frame", "applied", "chunk", "frame", "end"], "its chunk kept"
    assert events[4].fields["outcome"] == "dropped_lost" and events[4].fields["sha256"] is None

    # replay generates such a frame and says it could not be compared; the rest stays exact
    lines = (recorded / "events.jsonl").read_text().splitlines(keepends=True)
    i = next(n for n, x in enumerate(lines) if '"type":"frame"' in x and '"index":5,' in x)
    obj = json.loads(lines[i])
    lines[i] = json.dumps(obj | {"outcome": "dropped_lost", "sha256": None}, separators=(",", ":")) + "\n"
    edited = tmp_path / "edited"
    shutil.copytree(recorded, edited)
    (edited / "events.jsonl").write_text("".join(lines))
    report = replay(edited / "events.jsonl", model=model)
    assert report.unverified == [5] and report.mismatched == [] and report.exact, report
    assert report.identical == report.frames - 1
