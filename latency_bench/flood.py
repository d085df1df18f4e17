"""`flood`: does one client's action flood cost its neighbours more than a plain CPU burner would?

    python -m worldcast.latency_bench.flood --seconds 10 --rate 2000 --out flood_results/

Starts `worldcast serve` in a child process, opens a *victim* session that acts at 4 Hz, and measures its
delivered frames/s over three windows of `--seconds` each:

1. quiet: nothing else runs;
2. burner: a child process spinning one core (`while True: pass`);
3. flood: a child process with its own session sending `--rate` action messages/s on its `actions` data
   channel, every other one junk (not JSON), the rest valid but far over the rate limit (issue 13); with
   `--kind stream`, junk text on its session's WebSocket stream instead.

`--server-profile PATH` runs the server under cProfile (the event loop's thread) to see where a flood's
CPU goes (`python -m pstats PATH`).

It reports the victim's frames/s in each, the ratios flood / burner (issue 22's bar: >= 0.9; the
flooder is itself a process spinning on the same cores) and flood / quiet, what the flooder saw
(messages sent, events back, when it was disconnected and why) and the server's input
counters. Frames/s is counted from 1 s into each window. The machine this runs on is shared: compare
ratios of one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from worldcast.latency_bench import report
from worldcast.latency_bench.probe import SessionProbe
from worldcast.latency_bench.server import ServerProfile, process_metric, spawn

SETTLE_S = 1.0


def _fps(p: SessionProbe, start: float, end: float) -> float:
    n = sum(1 for f in p.frames if start + SETTLE_S <= f.arrival_s < end)
    return n / max(1e-9, end - start - SETTLE_S)


async def _input_counts(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("worldcast_input_messages_total", "worldcast_peer_closes_total"):
                key = f"{s.labels.get('channel', 'peer')}:{s.labels.get('outcome', s.labels.get('reason'))}"
                out[key] = s.value
    return out


def _bins(p: SessionProbe, start: float, end: float) -> list[int]:
    """The victim's frames in each whole second from `start` (the first second included)."""
    n = int(end - start)
    out = [0] * n
    for f in p.frames:
        k = int(f.arrival_s - start)
        if 0 <= k < n and f.arrival_s >= start:
            out[k] += 1
    return out


async def _server_cpu_s(url: str) -> float:
    """The server process's CPU time so far, s (`process_cpu_seconds_total` on its /metrics)."""
    return await process_metric(url, "process_cpu_seconds_total")


async def _window(p: SessionProbe, seconds: float, child: list[str] | None, *,
                  wait_child: bool = False, bins: list[int] | None = None) -> tuple[float, str]:
    """The victim's frames/s over `seconds` while `child` runs; its stdout if `wait_child` (else it is killed).
    `bins` gets the frames of each second of the window (`_bins`)."""
    proc = subprocess.Popen(child, stdout=subprocess.PIPE, text=True, env=os.environ.copy()) if child else None
    out = ""
    try:
        if proc is not None and wait_child:  # the flooder says when it is connected and starts flooding
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)  # type: ignore[union-attr]
            if line.strip() != "ready":
                raise RuntimeError(f"flooder: {line!r}")
        start = time.monotonic()
        await p.act_for(seconds, 4.0)
        fps = _fps(p, start, time.monotonic())
        if bins is not None:
            bins += _bins(p, start, time.monotonic())
        if proc is not None and wait_child:
            out, _ = await asyncio.to_thread(proc.communicate, None, 60)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    return fps, out


#: The bar (issue 22): the victim keeps at least this share of its frame rate beside the flood, taking as the
#: reference the frame rate beside a CPU burner (the flooder is itself a process spinning on the same cores).
BAR = 0.9
#: What the flooder sends: `actions` on the WebRTC actions data channel (half junk, half valid past the rate
#: limit), or `stream`: junk text on the session's WebSocket stream.
KINDS = ("actions", "stream")


async def run(url: str, *, seconds: float, rate: float, kind: str = "actions",
              windows: tuple[str, ...] = ("quiet", "burner", "flood")) -> dict[str, Any]:
    victim = await SessionProbe.open(url, seed=1, stamped=False)
    fps: dict[str, float] = {}
    by_second: dict[str, list[int]] = {"quiet": [], "burner": [], "flood": []}
    cpu: dict[str, float] = {}  #: the server's CPU time per wall second in each window (its process, all threads)
    out = ""
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    try:
        await victim.first_frame(60.0)
        await victim.act_for(2.0, 4.0)  # warm
        if "quiet" in windows:
            c0, t0 = await _server_cpu_s(url), time.monotonic()
            fps["quiet"], _ = await _window(victim, seconds, None, bins=by_second["quiet"])
            cpu["quiet"] = (await _server_cpu_s(url) - c0) / (time.monotonic() - t0)
        if "burner" in windows:
            c0, t0 = await _server_cpu_s(url), time.monotonic()
            fps["burner"], _ = await _window(victim, seconds, [sys.executable, "-c", "while True: pass"],
                                             bins=by_second["burner"])
            cpu["burner"] = (await _server_cpu_s(url) - c0) / (time.monotonic() - t0)
        if "flood" in windows:
            before = await _input_counts(url)
            flooder_cmd = [sys.executable, "-m", "worldcast.latency_bench.flood", "--flooder", url,
                           "--rate", str(rate), "--seconds", str(seconds), "--kind", kind]
            c0, t0 = await _server_cpu_s(url), time.monotonic()
            fps["flood"], out = await _window(victim, seconds, flooder_cmd, wait_child=True,
                                              bins=by_second["flood"])
            cpu["flood"] = (await _server_cpu_s(url) - c0) / (time.monotonic() - t0)
            after = await _input_counts(url)
    finally:
        await victim.close()
    lines = out.strip().splitlines()
    flooder = json.loads(lines[-1]) if lines else {}
    burner, flood, quiet = fps.get("burner"), fps.get("flood"), fps.get("quiet")
    return {
        "seconds": seconds, "rate_hz": rate, "kind": kind,
        "victim_fps": fps,
        "victim_frames_by_second": by_second,  # each second of each window, the first one included
        "server_cpu_per_s": cpu,  # (the flood window's also covers the flooder's connect, before it floods)
        "flood_over_burner": flood / burner if flood is not None and burner else None,
        "flood_over_quiet": flood / quiet if flood is not None and quiet else None,
        "bar": BAR,
        "bar_met": bool(flood is not None and burner and flood / burner >= BAR),
        "flooder": flooder,
        "server_counts_during_flood": {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)},
    }


async def stream_flooder(url: str, *, rate: float, seconds: float) -> dict[str, Any]:
    """A flooding stream client: `rate` junk text messages/s on its session's WebSocket stream."""
    from worldcast.transport.clients import StreamClient

    c = await StreamClient.connect(url, seed=2)
    await c.next_frame(60)
    print("ready", flush=True)
    sent, t0, closed_at = 0, time.monotonic(), None
    batch = max(1, int(rate / 100))
    try:
        while (now := time.monotonic()) < t0 + seconds:
            if c.closed_code is None:
                try:
                    for _ in range(batch):
                        await c.send_raw("{junk")
                    sent += batch
                except Exception:  # noqa: BLE001 - closed under us
                    closed_at = closed_at or now - t0
                    await asyncio.sleep(0.05)
            else:
                closed_at = closed_at or now - t0
                await asyncio.sleep(0.05)  # cut off: idle, not a CPU burner
            await asyncio.sleep(max(0.0, t0 + sent / rate - time.monotonic()))
        errors = [e for e in c.events if e.get("event") in ("error", "disconnect")]
        disc = next((e for e in errors if e["event"] == "disconnect"), None)
        return {"sent": sent, "events_back": len(errors), "disconnect": disc and {
            "after_s": disc["received_s"] - t0, "message": disc["message"]}, "closed_after_s": closed_at,
            "close_code": c.closed_code}
    finally:
        await c.aclose()


async def flooder(url: str, *, rate: float, seconds: float) -> dict[str, Any]:
    """The flooding client (its own process): `rate` messages/s, half junk, for `seconds`."""
    from worldcast.transport.clients.webrtc import WebRTCClient
    from worldcast.transport.webrtc.peer import configure_ice

    configure_ice(["127.0.0.1"])
    c = await WebRTCClient.connect(url, seed=2)
    await c.next_frame()
    print("ready", flush=True)
    sent, t0 = 0, time.monotonic()
    batch = max(1, int(rate / 100))  # 100 batches a second
    disconnected_at = None
    try:
        while (now := time.monotonic()) < t0 + seconds:
            if c.actions.readyState == "open":
                for i in range(batch):
                    n = sent + i
                    c.actions.send("{junk" if n % 2 else json.dumps({"seq": n, "t": 0, "keys": ["w"]}))
                sent += batch
            else:  # cut off: wait out the window idle (spinning here would make the flooder a CPU burner)
                if disconnected_at is None:
                    disconnected_at = now - t0
                await asyncio.sleep(0.05)
            await asyncio.sleep(max(0.0, t0 + sent / rate - time.monotonic()))
        events = [e for e in c.events if e.get("event") in ("action_rejected", "disconnect")]
        disc = next((e for e in events if e["event"] == "disconnect"), None)
        return {"sent": sent, "events_back": len(events), "disconnect": disc and {
            "after_s": disc["received_at"] - t0, "message": disc["message"]}, "channel_closed_after_s": disconnected_at}
    finally:
        await c.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.flood", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="each window, s")
    p.add_argument("--rate", type=float, default=2000.0, help="flood messages per second")
    p.add_argument("--profile", default="static", help="server profile (static: both sessions are admitted)")
    p.add_argument("--out", type=Path, default=None, help="report folder (default flood_results/<time>/)")
    p.add_argument("--kind", choices=KINDS, default="actions",
                   help="actions: the WebRTC actions data channel (default); stream: junk on the WebSocket stream")
    p.add_argument("--windows", default="quiet,burner,flood", help="which windows to run, comma-separated")
    p.add_argument("--server-profile", type=Path, default=None, metavar="PATH",
                   help="run the server under cProfile (its event loop: the main thread) and write the stats here")
    p.add_argument("--flooder", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.flooder:
        fn = stream_flooder if a.kind == "stream" else flooder
        print(json.dumps(report._strict(asyncio.run(fn(a.flooder, rate=a.rate, seconds=a.seconds)))))
        return 0
    windows = tuple(w.strip() for w in a.windows.split(",") if w.strip())
    if not a.seconds > SETTLE_S or not a.rate > 0 or not set(windows) <= {"quiet", "burner", "flood"}:
        p.error(f"--seconds must exceed {SETTLE_S}, --rate be positive, --windows name quiet, burner, flood")
    py = ["-m", "cProfile", "-o", str(a.server_profile)] if a.server_profile else None
    with spawn(ServerProfile.parse(a.profile), python_args=py) as url:
        res = asyncio.run(run(url, seconds=a.seconds, rate=a.rate, kind=a.kind, windows=windows))
    if a.server_profile:
        res["server_profile"] = str(a.server_profile)
    out = a.out or Path("flood_results") / time.strftime("%Y%m%d-%H%M%S")
    report.write_json(out / "report.json", res)
    print(json.dumps(report._strict(res), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
