"""`soak`: sessions acting for an hour (or `--minutes`) against one server; drift and leaks, as JSON.

    python -m worldcast.latency_bench.soak --minutes 60 --sessions 1 --out soak_results/

It starts `worldcast serve` in a child process (profile `--profile`, default `shared`), opens a session
and closes it again (codecs and pools warmed), records the server's baseline resources from /metrics
(`process_open_fds`, `worldcast_threads`, `worldcast_event_loop_tasks`, `worldcast_peer_connections`,
`process_resident_memory_bytes`, with each engine process's `worldcast_engine_process_resident_memory_bytes`
added), then opens `--sessions` stamped sessions (latency_bench's
`SessionProbe`) that send actions at `--action-hz` throughout. It samples the server every
`--sample-s` and reports:

- RSS: at the end of the warm-up (`--warmup-minutes`, default a fifth of the run, at most 5 min) and at the
  end (medians of the last three samples each), and the growth between them, %;
- motion-to-photon read from the pixels over the first and the last `--mtp-window-s` of the run: p50 and
  p95 of each, and the change of p50, %;
- PTS monotonicity: decoded frames whose PTS did not increase, per session; frames and frames/s;
- leaks: after the sessions are deleted and their peers closed, fds, threads, loop tasks and peer
  connections over the baseline;
- the bars of issue 13 (RSS growth <= 5 %, end MTP p50 within 10 % of the start, no leaks), each true/false.

Nothing here asserts: the report says what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from worldcast.latency_bench import report, stats
from worldcast.latency_bench.probe import SessionProbe, model_fps
from worldcast.latency_bench.server import ServerProfile, resident_bytes, spawn

GAUGES = {"rss_bytes": "process_resident_memory_bytes", "fds": "process_open_fds", "threads": "worldcast_threads",
          "tasks": "worldcast_event_loop_tasks", "peers": "worldcast_peer_connections"}


async def server_gauges(http: httpx.AsyncClient) -> dict[str, float]:
    """The server's resource gauges from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await http.get("/metrics")).text
    by_name: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            by_name.setdefault(s.name, []).append(float(s.value))
    out = {k: by_name[v][0] if by_name.get(v) else float("nan") for k, v in GAUGES.items()}
    out["rss_bytes"] = resident_bytes(by_name)  # with the engine processes'
    return out


def _median_last(samples: list[dict[str, float]], key: str, before_s: float | None = None, n: int = 3) -> float:
    xs = [s[key] for s in samples if before_s is None or s["t_s"] <= before_s]
    return statistics.median(xs[-n:]) if xs else float("nan")


def _pct(a: float, b: float) -> float:
    return (b - a) / a * 100.0 if a else float("nan")


async def _settle_leaks(http: httpx.AsyncClient, timeout_s: float = 60.0) -> dict[str, float]:
    """Gauges once no peer is left and the counts stop falling (bounded)."""
    end = time.monotonic() + timeout_s
    last = await server_gauges(http)
    while time.monotonic() < end:
        await asyncio.sleep(1.0)
        now = await server_gauges(http)
        if now["peers"] == 0 and all(now[k] == last[k] for k in ("fds", "threads", "tasks")):
            return now
        last = now
    return last


async def soak(url: str, *, minutes: float, sessions: int, action_hz: float, sample_s: float,
               warmup_minutes: float, mtp_window_s: float) -> dict[str, Any]:
    fps = await model_fps(url)
    period_s = 1.0 / fps
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        warm = await SessionProbe.open(url, seed=999, stamped=True)  # codecs, executor threads, pools
        await warm.first_frame(60.0)
        await warm.act_for(2.0, action_hz)
        await warm.close()
        baseline = await _settle_leaks(http)
        probes = [await SessionProbe.open(url, seed=i, stamped=True) for i in range(sessions)]
        for p in probes:
            await p.first_frame(60.0)
        t0 = time.monotonic()
        duration_s = minutes * 60.0
        samples: list[dict[str, float]] = []
        actors = [asyncio.create_task(p.act_for(duration_s, action_hz)) for p in probes]
        try:
            next_sample = t0
            while (now := time.monotonic()) < t0 + duration_s:
                if now >= next_sample:
                    g = await server_gauges(http)
                    g["t_s"] = round(now - t0, 1)
                    g["frames"] = sum(len(p.frames) for p in probes)
                    samples.append(g)
                    next_sample += sample_s
                await asyncio.sleep(min(1.0, max(0.0, t0 + duration_s - time.monotonic())))
            await asyncio.gather(*actors)
            await asyncio.sleep(1.0)  # the last actions show up
            end = time.monotonic()
            win = min(mtp_window_s, duration_s / 3)
            start_m = [p.measure([(t0, t0 + win)], frame_period_s=period_s) for p in probes]
            end_m = [p.measure([(t0 + duration_s - win, t0 + duration_s)], frame_period_s=period_s) for p in probes]
            whole = [p.measure([(t0, end)], frame_period_s=period_s) for p in probes]
            pts_bad = [sum(1 for a, b in zip(p.frames, p.frames[1:]) if b.pts <= a.pts) for p in probes]
        finally:
            for t in actors:
                t.cancel()
            for p in probes:
                await p.close()
        after = await _settle_leaks(http)
    warm_s = min(warmup_minutes * 60.0, duration_s / 2)
    rss_warm, rss_end = _median_last(samples, "rss_bytes", before_s=warm_s), _median_last(samples, "rss_bytes")
    mtp_start = stats.percentiles([x for m in start_m for x in m.mtp_ms])
    mtp_end = stats.percentiles([x for m in end_m for x in m.mtp_ms])
    leaks = {k: after[k] - baseline[k] for k in ("fds", "threads", "tasks")} | {"peers": after["peers"]}
    out = {
        "minutes": minutes, "sessions": sessions, "action_hz": action_hz, "model_fps": fps,
        "rss_mib": {"baseline": baseline["rss_bytes"] / 2**20, "after_warmup": rss_warm / 2**20, "end": rss_end / 2**20,
                    "warmup_s": warm_s},
        "rss_growth_pct": _pct(rss_warm, rss_end),
        "mtp_ms": {"start": mtp_start, "end": mtp_end, "window_s": win},
        "mtp_p50_change_pct": _pct(mtp_start["p50"], mtp_end["p50"]),
        "frames": sum(m.frames for m in whole), "fps_mean": statistics.mean(m.fps for m in whole),
        "frames_missing": sum(m.frames_missing for m in whole),
        "pts_not_increasing": pts_bad,
        "actions_unanswered": sum(m.actions_unanswered for m in whole),
        "leaks": leaks, "baseline": baseline, "after": after,
        "samples": samples,
    }
    out["bars"] = {
        "rss_growth_le_5pct": out["rss_growth_pct"] <= 5.0,
        "mtp_p50_end_within_10pct": abs(out["mtp_p50_change_pct"]) <= 10.0,
        "no_leaks": all(v <= 0 for v in leaks.values()),
        "pts_monotonic": not any(pts_bad),
    }
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="length of the soak (default 60)")
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("--action-hz", type=float, default=4.0, help="actions per second per session")
    p.add_argument("--sample-s", type=float, default=10.0, help="server resource sampling period, s")
    p.add_argument("--warmup-minutes", type=float, default=None,
                   help="RSS growth is measured from here (default: a fifth of the run, at most 5)")
    p.add_argument("--mtp-window-s", type=float, default=60.0, help="MTP windows at the start and end, s")
    p.add_argument("--profile", default="shared", help="server profile (see latency_bench/server.py)")
    p.add_argument("--url", default=None, help="soak a running server instead (leaks are then its own)")
    p.add_argument("--out", type=Path, default=None, help="report folder (default soak_results/<time>/)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if not a.minutes > 0 or a.sessions < 1 or not a.action_hz > 0 or not a.sample_s > 0:
        p.error("--minutes, --action-hz and --sample-s must be positive and --sessions >= 1")
    try:
        profile = ServerProfile.parse(a.profile)
    except ValueError as e:
        p.error(str(e))
    warmup = a.warmup_minutes if a.warmup_minutes is not None else min(5.0, a.minutes / 5)
    out_dir = a.out or Path("soak_results") / time.strftime("%Y%m%d-%H%M%S")
    with contextlib.ExitStack() as stack:
        url = a.url or stack.enter_context(spawn(profile))
        res = asyncio.run(soak(url, minutes=a.minutes, sessions=a.sessions, action_hz=a.action_hz,
                               sample_s=a.sample_s, warmup_minutes=warmup, mtp_window_s=a.mtp_window_s))
    res["profile"] = profile.name
    res["machine"] = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    report.write_json(out_dir / "report.json", res)
    summary = {k: res[k] for k in ("minutes", "rss_growth_pct", "mtp_p50_change_pct", "frames", "fps_mean",
                                   "pts_not_increasing", "leaks", "bars")}
    summary["mtp_p50_ms"] = (res["mtp_ms"]["start"]["p50"], res["mtp_ms"]["end"]["p50"])
    print(json.dumps(report._strict(summary), indent=1))
    print(f"report: {out_dir / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
