"""Engine processes from outside: what a crash costs, and what a move costs the moved session's stream.

    python -m worldcast.latency_bench engines --kills 3 --moves 10

Runs against a server with two engine processes (started here with
`--engines 2 --admission static --max-sessions 4 --admin-token ...`, or
`--url` with `--admin-token`). Every session streams over the WebSocket
stream (fMP4, not decoded: the client only reads events) with 4 actions/s.

- kill: two sessions on different engines; SIGKILL of one engine's pid (from
  `GET /v1/engines` with the admin token); measured: kill -> the victim's `engine_lost` event, kill
  -> the engine `ready` again, the survivor's frames in the 4 s before and
  after the kill.
- move: one session moved back and forth between the engines
  (`POST /v1/sessions/{id}/move`); measured: the server's capture and restore
  times, and on the stream the longest gap between media events around the
  move against the median gap, and the server-side lateness of the first frame after it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from worldcast.transport.clients.stream import StreamClient

#: Frames are paced one period apart: a media gap over this many periods counts as the move's cost.
WINDOW_S = 4.0


@dataclass
class KillResult:
    """One SIGKILL of an engine process."""

    to_engine_lost_ms: float  #: kill -> the victim's `engine_lost` event at the client
    to_ready_s: float  #: kill -> the engine `ready` again (GET /v1/engines)
    survivor_fps_before: float  #: the other session's frames/s over the 4 s before the kill
    survivor_frames_after: int  #: its frames in the 4 s after the kill
    load_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass
class MoveResult:
    """One move of a streaming session."""

    export_ms: float  #: the server's capture (incl. waiting for the chunk in flight)
    import_ms: float  #: the server's transfer and restore
    state_bytes: int
    gap_ms: float  #: longest gap between the session's media events from the request to 1 s after it
    median_gap_ms: float  #: its median gap before the move
    lateness_after_ms: float  #: server-side lateness of its first frame after the move


@dataclass
class EnginesReport:
    kills: list[KillResult] = field(default_factory=list)
    moves: list[MoveResult] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def med(xs: list[float]) -> float:
            return round(statistics.median(xs), 2) if xs else float("nan")
        return {
            "kills": len(self.kills),
            "kill_to_engine_lost_ms_median": med([k.to_engine_lost_ms for k in self.kills]),
            "kill_to_ready_s_median": med([k.to_ready_s for k in self.kills]),
            "survivor_fps_before_median": med([k.survivor_fps_before for k in self.kills]),
            "survivor_frames_after_min": min((k.survivor_frames_after for k in self.kills), default=0),
            "moves": len(self.moves),
            "move_export_ms_median": med([m.export_ms for m in self.moves]),
            "move_import_ms_median": med([m.import_ms for m in self.moves]),
            "move_gap_ms_median": med([m.gap_ms for m in self.moves]),
            "move_gap_ms_max": max((m.gap_ms for m in self.moves), default=float("nan")),
            "stream_median_gap_ms": med([m.median_gap_ms for m in self.moves]),
            "move_lateness_after_ms_median": med([m.lateness_after_ms for m in self.moves]),
            "state_bytes": self.moves[0].state_bytes if self.moves else 0,
            "load_avg_at_end": os.getloadavg(),
        }

    def as_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "kills": [asdict(k) for k in self.kills],
                "moves": [asdict(m) for m in self.moves]}


def _media(c: StreamClient, since_s: float = 0.0) -> list[dict[str, Any]]:
    return [e for e in list(c.events) if e.get("event") == "media" and e["received_s"] >= since_s]


async def _act(c: StreamClient, hz: float = 4.0) -> None:
    keys = [["d"], ["w"], ["a"], ["s"]]
    i = 0
    while True:
        await c.send_action(keys[i % 4])
        i += 1
        await asyncio.sleep(1 / hz)


async def _engines(http: httpx.AsyncClient) -> dict[int, dict[str, Any]]:
    return {e["id"]: e for e in (await http.get("/v1/engines")).json()["engines"]}


async def _until(cond, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.01)


async def _wait_ready(http: httpx.AsyncClient, timeout_s: float = 300.0) -> None:
    end = time.monotonic() + timeout_s
    while (await http.get("/readyz")).json().get("engines", {}).get("up") != 2:
        if time.monotonic() > end:
            raise TimeoutError("engines not both ready")
        await asyncio.sleep(0.05)


async def one_kill(url: str, http: httpx.AsyncClient) -> KillResult:
    """Two sessions on different engines, SIGKILL of one engine (see the module docstring)."""
    await _wait_ready(http)
    a = await StreamClient.connect(url, decode=False)
    b = await StreamClient.connect(url, decode=False)
    tasks = [asyncio.create_task(_act(c)) for c in (a, b)]
    try:
        placed = {c: (await http.get(f"/v1/sessions/{c.session_id}",
                                     headers={"Authorization": f"Bearer {c.token}"})).json()["engine"] for c in (a, b)}
        if placed[a] == placed[b]:
            raise RuntimeError("both sessions are on one engine (is another client using the server?)")
        await _until(lambda: len(_media(a)) >= 20 and len(_media(b)) >= 20, 60)
        t0 = time.monotonic()
        await asyncio.sleep(WINDOW_S)
        fps_before = len(_media(a, t0)) / WINDOW_S
        victim = placed[b]
        pid = (await _engines(http))[victim]["pid"]
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        ev = await b.wait_event(lambda e: e.get("event") == "error", timeout_s=30, past=True)
        if ev.get("code") != "engine_lost":
            raise RuntimeError(f"the victim got {ev}")
        lost_ms = (ev["received_s"] - t_kill) * 1e3
        while True:
            e = (await _engines(http))[victim]
            if e["state"] == "ready" and e["pid"] != pid:
                break
            await asyncio.sleep(0.02)
        ready_s = time.monotonic() - t_kill
        await asyncio.sleep(max(0.0, t_kill + WINDOW_S - time.monotonic()))
        after = len([m for m in _media(a, t_kill) if m["received_s"] <= t_kill + WINDOW_S])
        return KillResult(lost_ms, ready_s, fps_before, after, os.getloadavg())
    finally:
        for t in tasks:
            t.cancel()
        await a.aclose()
        await b.aclose(delete=False)


async def moves(url: str, http: httpx.AsyncClient, *, admin_token: str, count: int) -> list[MoveResult]:
    """One session moved back and forth `count` times (see the module docstring)."""
    await _wait_ready(http)
    c = await StreamClient.connect(url, decode=False)
    act = asyncio.create_task(_act(c))
    out = []
    try:
        await _until(lambda: len(_media(c)) >= 20, 60)
        auth = {"Authorization": f"Bearer {admin_token}"}
        for _ in range(count):
            await asyncio.sleep(1.5)
            before = _media(c, time.monotonic() - 1.5)
            gaps = [(y["received_s"] - x["received_s"]) * 1e3 for x, y in zip(before, before[1:])]
            t0 = time.monotonic()
            r = await http.post(f"/v1/sessions/{c.session_id}/move", json={}, headers=auth)
            r.raise_for_status()
            rep = r.json()
            await asyncio.sleep(1.0)
            around = [m for m in _media(c, t0 - 0.2) if m["received_s"] <= time.monotonic()]
            gap = max((y["received_s"] - x["received_s"]) * 1e3 for x, y in zip(around, around[1:]))
            first_after = next((m for m in _media(c, t0 + (rep["export_ms"] + rep["import_ms"]) / 1e3)), None)
            out.append(MoveResult(rep["export_ms"], rep["import_ms"], rep["state_bytes"], gap,
                                  statistics.median(gaps) if gaps else float("nan"),
                                  first_after["lateness_ms"] if first_after else float("nan")))
    finally:
        act.cancel()
        await c.aclose()
    return out


async def run(url: str, *, admin_token: str, kills: int, move_count: int) -> EnginesReport:
    rep = EnginesReport()
    # the admin token on every request: `GET /v1/engines` names pids and sessions only to the operator
    async with httpx.AsyncClient(base_url=url, timeout=60, headers={"Authorization": f"Bearer {admin_token}"}) as http:
        for _ in range(kills):
            rep.kills.append(await one_kill(url, http))
        if move_count:
            rep.moves = await moves(url, http, admin_token=admin_token, count=move_count)
    return rep


def new_token() -> str:
    return secrets.token_urlsafe(24)
