"""Snapshots through the real server: a session started from one makes, as its first frame, exactly the frame the
snapshotted session made next with the same inputs (compared by the recordings' pixel hashes), also on a server
started afresh over the same snapshots directory; any number may start from one; bad snapshots and strangers are
refused and nothing is half restored."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from tests.conftest import _serve, server_config
from worldcast.sessions.recording import read_log
from worldcast.transport.clients.stream import StreamClient


def _frames(cfg, sid: str) -> dict[int, str]:  # type: ignore[no-untyped-def]
    """Frame index -> pixel sha256 from a session's recording."""
    return {e.fields["index"]: e.fields["sha256"] for e in read_log(cfg.recordings.directory / sid / "events.jsonl")
            if e.type == "frame"}


async def _until(cond, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def _fork(url: str, snapshot_id: str, token: str, recordings: Path, last: int) -> str:
    """A session from the snapshot (recorded, to read its frames), resumed over HTTP without a client (a client
    would start its own inputs: the snapshot's held keys stay held), until its recording has frame `last`."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"snapshot": snapshot_id, "record": True},
                            headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
        fid, auth = r.json()["session_id"], {"Authorization": f"Bearer {r.json()['token']}"}
        assert (await http.post(f"/v1/sessions/{fid}/rpc", headers=auth, json={"id": 1, "method": "resume"})
                ).status_code == 200
        log = recordings / fid / "events.jsonl"
        await _until(lambda: log.exists() and f'"index":{last},' in log.read_text())
        assert (await http.delete(f"/v1/sessions/{fid}", headers=auth)).status_code == 204
        return fid


async def _original(url: str) -> tuple[str, str, dict]:  # type: ignore[type-arg]
    """A recorded session driven for a while, keys released, then snapshotted; it makes a few more frames."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"record": True, "seed": 3, "prompt": "rivers of glowing molten lava"})
        sid, token = r.json()["session_id"], r.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        c = await StreamClient.attach(url, sid, token, model=r.json()["model"])
        try:
            for i in range(10):
                await c.send_action(keys=["d", "s"] if i < 6 else ["w"])
                await c.next_frame()
            seq = await c.send_action(keys=["d"])  # held through the snapshot: the world moves on after it
            while (await c.next_frame()).action_seq < seq:
                pass
            snap = await http.post(f"/v1/sessions/{sid}/snapshots", headers=auth)
            assert snap.status_code == 201, snap.text
            for _ in range(6):
                await c.next_frame()
        finally:
            await c.aclose(delete=False)
        assert (await http.delete(f"/v1/sessions/{sid}", headers=auth)).status_code == 204
        return sid, token, snap.json()


def test_a_fork_makes_the_frame_the_original_made_next_also_after_a_restart(model) -> None:  # type: ignore[no-untyped-def]
    cfg = server_config()
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        sid, token, snap = asyncio.run(_original(server.url))
        n = snap["next_frame"]
        assert n > 10 and snap["state_bytes"] > 0
        original = _frames(cfg, sid)
        want = [original[i] for i in range(n, n + 3)]
        assert len(set(want)) == 3, "d held: the world moves, each frame differs (so the check below can fail)"
        rec = cfg.recordings.directory
        forks = [asyncio.run(_fork(server.url, snap["snapshot_id"], token, rec, n + 2)) for _ in range(2)]
        for fid in forks:  # any number may start from one, each alone here, each the same next frames
            got = _frames(cfg, fid)
            assert min(got) == n and [got[i] for i in range(n, n + 3)] == want, (fid, min(got), n)
    finally:
        serving.close()
    again = server_config(snapshots=cfg.snapshots)  # a new server over the same snapshots directory
    serving = _serve(again, model)
    server = next(serving)
    try:
        fid = asyncio.run(_fork(server.url, snap["snapshot_id"], token, again.recordings.directory, n + 2))
        assert [_frames(again, fid)[i] for i in range(n, n + 3)] == want
    finally:
        serving.close()


async def _refusals(url: str, snapshots: Path) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"seed": 1})
        sid, token = r.json()["session_id"], r.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        c = await StreamClient.attach(url, sid, token, model=r.json()["model"])
        try:
            await c.next_frame()
            snap = (await http.post(f"/v1/sessions/{sid}/snapshots", headers=auth)).json()
            v = (await http.post(f"/v1/sessions/{sid}/viewers", headers=auth)).json()
            assert (await http.post(f"/v1/sessions/{sid}/snapshots",
                                    headers={"Authorization": f"Bearer {v['viewer_token']}"})).status_code == 404
        finally:
            await c.aclose()
        sid_ = snap["snapshot_id"]

        async def create(body: dict, tok: str | None = token) -> httpx.Response:  # type: ignore[type-arg]
            return await http.post("/v1/sessions", json=body, headers={"Authorization": f"Bearer {tok}"} if tok else {})
        assert (await create({"snapshot": sid_}, None)).status_code == 401
        assert (await create({"snapshot": sid_}, "someone-else")).status_code == 404
        assert (await create({"snapshot": sid_, "prompt": "a field"})).status_code == 422
        assert (await create({"snapshot": "../etc"})).status_code == 422
        state = snapshots / sid_ / "state.bin"
        good = state.read_bytes()
        state.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit
        r = await create({"snapshot": sid_})
        assert r.status_code == 409 and "cut or edited" in r.json()["detail"], r.text
        state.write_bytes(good[: len(good) // 2])
        assert "cut or edited" in (await create({"snapshot": sid_})).json()["detail"]
        state.write_bytes(good)
        meta = json.loads((snapshots / sid_ / "meta.json").read_text())
        (snapshots / sid_ / "meta.json").write_text(json.dumps(meta | {"format": "worldcast-snapshot/0"}))
        assert "format" in (await create({"snapshot": sid_})).json()["detail"]
        (snapshots / sid_ / "meta.json").write_text(json.dumps(meta | {"model": "another"}))
        assert "of model 'another'" in (await create({"snapshot": sid_})).json()["detail"]
        (snapshots / sid_ / "meta.json").write_text(json.dumps(meta))
        r = await create({"snapshot": sid_})
        assert r.status_code == 201, r.text
        await http.delete(f"/v1/sessions/{r.json()['session_id']}",
                          headers={"Authorization": f"Bearer {r.json()['token']}"})
        assert (await http.delete(f"/v1/snapshots/{sid_}", headers={"Authorization": "Bearer x"})).status_code == 404
        assert (await http.delete(f"/v1/snapshots/{sid_}", headers={"Authorization": f"Bearer {token}"})
                ).status_code == 204
        assert (await create({"snapshot": sid_})).status_code == 404


def test_bad_snapshots_and_strangers_are_refused_and_nothing_is_half_restored(model) -> None:  # type: ignore[no-untyped-def]
    cfg = server_config()
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        assert cfg.snapshots is not None
        asyncio.run(_refusals(server.url, cfg.snapshots.directory))
        assert server.manager.sessions == {}, "every refused start left nothing behind"
        assert all(not e.session_ids for e in server.manager.engines)
    finally:
        serving.close()


def test_a_full_store_refuses_with_the_reason(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from worldcast.sessions.snapshots import SnapshotConfig

    cfg = server_config(snapshots=SnapshotConfig(tmp_path / "snaps", max_snapshots=1))
    serving = _serve(cfg, model)
    server = next(serving)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            r = http.post("/v1/sessions", json={})
            auth = {"Authorization": f"Bearer {r.json()['token']}"}
            sid = r.json()["session_id"]
            assert http.post(f"/v1/sessions/{sid}/snapshots", headers=auth).status_code == 201
            r = http.post(f"/v1/sessions/{sid}/snapshots", headers=auth)
            assert r.status_code == 409 and "holds 1 snapshots, its most" in r.json()["detail"]
            assert len(list((tmp_path / "snaps").iterdir())) == 1
    finally:
        serving.close()

