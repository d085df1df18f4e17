"""Replay of sessions that shared batched steps, and of sessions started from a snapshot, through the real server.

Batched: on this CPU TinyWorld's eager kernels happen to give a row the same bits at batch 1 and 2 (its compiled
steps do not: `make replay-check`), so a test of batch shapes needs a model that does not. `BatchVariantTinyWorld`
is that fake: TinyWorld whose denoise output is scaled by a factor a few ulps from 1 that depends on the batch size
and the row, as a batched kernel's summation order can; a row still depends only on its own inputs. Two sessions
recorded side by side on one engine replay frame for frame when replay runs each forward at its recorded batch size
and row; the same logs with the batch places removed do not (so the check can fail).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import httpx
import pytest
import torch

from tests.conftest import _serve, server_config
from worldcast.models.tinyworld import TinyWorldModel
from worldcast.sessions.recording import SNAPSHOT_FILE, RecordingError, read_log
from worldcast.sessions.replay import replay
from worldcast.transport.clients.stream import StreamClient


class BatchVariantTinyWorld(TinyWorldModel):
    """A fake batched kernel: TinyWorld's x0 times (1 + 2**-18 * (8 * batch + row)), per row."""

    def denoise(self, x_t, t, cond, state):  # type: ignore[no-untyped-def]
        x0 = super().denoise(x_t, t, cond, state)
        b = x0.shape[0]
        scale = 1 + 2.0**-18 * (8 * b + torch.arange(b, dtype=x0.dtype, device=x0.device))
        return x0 * scale.view(b, *([1] * (x0.dim() - 1)))


@pytest.fixture(scope="module")
def variant() -> BatchVariantTinyWorld:
    m = BatchVariantTinyWorld.from_pretrained()
    assert isinstance(m, BatchVariantTinyWorld)
    return m


async def _drive(url: str, seed: int, keys: list[list[str]], frames: int) -> str:
    """A recorded session played over the fMP4 stream for `frames` frames; returns its id (closed)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"record": True, "seed": seed})
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        c = await StreamClient.attach(url, sid, token, model=r.json()["model"])
        try:
            for i in range(frames):
                if i % 5 == 0:
                    await c.send_action(keys=keys[(i // 5) % len(keys)])
                await c.next_frame()
        finally:
            await c.aclose(delete=False)
        assert (await http.delete(f"/v1/sessions/{sid}", headers={"Authorization": f"Bearer {token}"})
                ).status_code == 204
        return sid


def _without_batches(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    out = []
    for line in (src / "events.jsonl").read_text().splitlines(keepends=True):
        obj = json.loads(line)
        if obj.get("type") == "chunk" and "batches" in obj:
            del obj["batches"]
            line = json.dumps(obj, separators=(",", ":")) + "\n"
        out.append(line)
    (dst / "events.jsonl").write_text("".join(out))
    return dst / "events.jsonl"


def test_sessions_batched_together_replay_frame_for_frame(variant: BatchVariantTinyWorld, tmp_path: Path) -> None:
    cfg = server_config()
    serving = _serve(cfg, variant)
    server = next(serving)

    async def both() -> list[str]:
        return list(await asyncio.gather(_drive(server.url, 5, [["d"], ["w", "shift"], []], 40),
                                         _drive(server.url, 6, [["a"], ["s"]], 40)))
    try:
        sids = asyncio.run(both())
    finally:
        serving.close()
    assert cfg.recordings is not None
    logs = [cfg.recordings.directory / sid / "events.jsonl" for sid in sids]
    places = [e.fields["batches"] for log in logs for e in read_log(log) if e.type == "chunk" and "batches" in e.fields]
    assert any(d[0] == 2 for p in places for d in p["denoise"]), "the two sessions shared batched steps"
    assert {d[1] for p in places for d in p["denoise"] if d[0] == 2} == {0, 1}, "at either row"
    for i, log in enumerate(logs):
        report = replay(log, model=variant)
        assert report.frames >= 40 and report.mismatched == [] and report.exact, report
        alone = replay(_without_batches(log.parent, tmp_path / f"alone{i}"), model=variant)
        assert alone.mismatched, "replayed at batch 1 throughout, the fake kernel's rounding differs"


async def _fork_recorded(server, snapshot_id: str, token: str, frames: int) -> str:  # type: ignore[no-untyped-def]
    """A recorded session from the snapshot, resumed over HTTP without a client, closed once it made `frames`
    frames (waited on its frame pipeline's delivery, on the server's loop)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"snapshot": snapshot_id, "record": True},
                            headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
        fid, auth = r.json()["session_id"], {"Authorization": f"Bearer {r.json()['token']}"}
        enough = threading.Event()
        pipeline = server.manager.sessions[fid].frames
        seen = [0]

        def count(_frame) -> None:  # type: ignore[no-untyped-def]
            seen[0] += 1
            if seen[0] >= frames:
                enough.set()
        pipeline.on_delivered.append(count)
        assert (await http.post(f"/v1/sessions/{fid}/rpc", headers=auth, json={"id": 1, "method": "resume"})
                ).status_code == 200
        assert await asyncio.to_thread(enough.wait, 60), "the fork made its frames"
        assert (await http.delete(f"/v1/sessions/{fid}", headers=auth)).status_code == 204
        return fid


async def _snapshotted(url: str) -> tuple[str, str]:
    """A session played with keys held, snapshotted mid-play (held keys kept); returns the snapshot id, token."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"seed": 9, "prompt": "a snowy landscape"})
        sid, token = r.json()["session_id"], r.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        c = await StreamClient.attach(url, sid, token, model=r.json()["model"])
        try:
            for i in range(8):
                await c.send_action(keys=["a"] if i < 4 else ["d", "w"])
                await c.next_frame()
            snap = await http.post(f"/v1/sessions/{sid}/snapshots", headers=auth)
            assert snap.status_code == 201, snap.text
        finally:
            await c.aclose()
        return snap.json()["snapshot_id"], token


def test_a_session_started_from_a_snapshot_replays_from_it(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = server_config()
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        snapshot_id, token = asyncio.run(_snapshotted(server.url))
        fid = asyncio.run(_fork_recorded(server, snapshot_id, token, 12))
    finally:
        serving.close()
    assert cfg.recordings is not None
    folder = cfg.recordings.directory / fid
    header = next(read_log(folder / "events.jsonl")).fields
    assert header["snapshot"] == snapshot_id and header["from_start"] and (folder / SNAPSHOT_FILE).exists()
    report = replay(folder / "events.jsonl", model=model)
    assert report.frames >= 12 and report.mismatched == [] and report.exact, report
    indices = [e.fields["index"] for e in read_log(folder / "events.jsonl") if e.type == "frame"]
    assert min(indices) >= 8, "it began where the snapshot left the world, not at frame 0"

    # the snapshot's state is what replay starts from: missing or another one is refused, naming it
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    (moved / SNAPSHOT_FILE).rename(tmp_path / "state.bin")
    with pytest.raises(RecordingError, match="--snapshot"):
        replay(moved / "events.jsonl", model=model)
    assert replay(moved / "events.jsonl", model=model, snapshot=tmp_path / "state.bin").exact
    blob = (tmp_path / "state.bin").read_bytes()
    (tmp_path / "state.bin").write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(RecordingError, match="sha256 differs"):
        replay(moved / "events.jsonl", model=model, snapshot=tmp_path / "state.bin")
