"""`make replay-check`: record scripted sessions through a real server, replay their logs, and measure what
recording costs the live stream.

    python -m worldcast.latency_bench.replay_check --seconds 60 --out bench_results/replay

1. Side by side: two sessions on one server (`worldcast serve` in a child process) run the same script at
   once, one created with `"record": true`, one without; action-to-frame latency of each (from sending an
   action to the first received frame whose `action_seq` covers it, over the fMP4 stream) is reported, so
   recording's cost on the live stream reads off one run. The two share batched steps (replay runs each of the
   recorded session's forwards at its recorded batch size and row; the report counts the chunks that had one
   at batch 2 or more).
2. Alone: one recorded session runs the script by itself (batch 1 throughout).
3. Each recorded log is fetched over HTTP (GET /v1/sessions/{id}/recording/events) and replayed in this
   process (`sessions/replay.py`); the report says how many frames came out identical to the recorded ones.

The script: keys and a stick axis changing every 0.5 s, a prompt switch and a flush every 15 s, and a pause of
3 s (an idle gap) once. Numbers go to report.json in --out; nothing is asserted (BENCHMARKS.md records them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from worldcast.latency_bench.server import serve_process
from worldcast.transport.clients.stream import StreamClient

PROMPTS = ("a snowy landscape", "rivers of glowing molten lava", "a green meadow", "a sandy desert at noon")
KEYS = (["d"], ["s"], ["a", "shift"], ["w"], [], ["d", "s"])


async def _drive(url: str, *, seconds: float, record: bool, seed: int) -> dict[str, Any]:
    """Run the script on a new session; returns its id, token and latencies (ms)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"record": record, "seed": seed})
        r.raise_for_status()
        info = r.json()
        sid, token = info["session_id"], info["token"]
        auth = {"Authorization": f"Bearer {token}"}
        c = await StreamClient.attach(url, sid, token, model=info["model"])
        sent: dict[int, float] = {}
        lat: list[float] = []
        covered = -1
        t0 = time.monotonic()
        step, paused = 0, False

        async def read() -> None:
            nonlocal covered
            while True:
                f = await c.next_frame(timeout_s=30)
                if f.action_seq > covered:
                    for s in range(covered + 1, f.action_seq + 1):
                        if s in sent:
                            lat.append((f.received_s - sent.pop(s)) * 1e3)
                    covered = f.action_seq

        reader = asyncio.create_task(read())
        try:
            while (now := time.monotonic() - t0) < seconds:
                if step % 30 == 29:  # every 15 s: a new prompt, applied at once
                    await http.post(f"/v1/sessions/{sid}/rpc", headers=auth, json={
                        "id": step, "method": "set_prompt", "params": {"prompt": PROMPTS[(step // 30) % 4]}})
                    await http.post(f"/v1/sessions/{sid}/rpc", headers=auth, json={"id": -step, "method": "flush"})
                if not paused and now > seconds / 2:
                    paused = True
                    await c.rpc("pause")
                    await asyncio.sleep(3.0)
                    await c.rpc("resume")
                seq = await c.send_action(keys=KEYS[step % len(KEYS)],
                                          axes={"look_x": [-1.0, 0.0, 0.5][step % 3]} if step % 2 else None)
                sent[seq] = time.monotonic()
                step += 1
                await asyncio.sleep(0.5)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await c.aclose(delete=False)
            await http.delete(f"/v1/sessions/{sid}", headers=auth)
        return {"session_id": sid, "token": token, "record": record, "actions": step, "latency_ms": lat}


def _summary(lat: list[float]) -> dict[str, float]:
    if not lat:
        return {}
    q = statistics.quantiles(lat, n=20) if len(lat) > 1 else [lat[0]] * 19
    return {"n": len(lat), "p50_ms": round(statistics.median(lat), 1), "p95_ms": round(q[18], 1),
            "mean_ms": round(statistics.fmean(lat), 1)}


async def _fetch(url: str, run: dict[str, Any], into: Path) -> Path:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.get(f"/v1/sessions/{run['session_id']}/recording/events",
                           headers={"Authorization": f"Bearer {run['token']}"})
        r.raise_for_status()
    path = into / run["session_id"] / "events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(r.content)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each scripted session, s")
    ap.add_argument("--out", type=Path, default=Path("bench_results") / time.strftime("replay-%Y%m%d-%H%M%S"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rec_dir = Path(tempfile.mkdtemp(prefix="worldcast-replay-check-"))
    out: dict[str, Any] = {"machine": platform.platform(), "processor": platform.processor(),
                           "seconds": args.seconds}
    with serve_process(["--recordings-dir", str(rec_dir)], name="replay-check") as url:
        async def side_by_side() -> list[dict[str, Any]]:
            return list(await asyncio.gather(_drive(url, seconds=args.seconds, record=True, seed=5),
                                             _drive(url, seconds=args.seconds, record=False, seed=5)))
        on, off = asyncio.run(side_by_side())
        alone = asyncio.run(_drive(url, seconds=args.seconds, record=True, seed=6))
        logs = {"side_by_side": asyncio.run(_fetch(url, on, args.out)),
                "alone": asyncio.run(_fetch(url, alone, args.out))}
    out["latency_side_by_side"] = {"recording": _summary(on["latency_ms"]),
                                   "not_recording": _summary(off["latency_ms"])}
    out["latency_alone_recording"] = _summary(alone["latency_ms"])
    from worldcast.sessions.replay import replay

    for name, path in logs.items():
        t = time.monotonic()
        r = replay(path)
        batched = sum(1 for x in path.read_text().splitlines() if x.startswith('{"type":"chunk"') and '"batches"' in x)
        out[f"replay_{name}"] = {"frames": r.frames, "identical": r.identical, "chunks": r.chunks,
                                 "batched_chunks": batched, "unverified": len(r.unverified),
                                 "dropped_draws": r.dropped_draws, "first_mismatches": r.mismatched[:10],
                                 "differences": r.differences, "replay_s": round(time.monotonic() - t, 1),
                                 "log_bytes": path.stat().st_size}
    (args.out / "report.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
