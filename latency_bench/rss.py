"""`rss`: does the server's resident memory come back after repeated peaks of sessions?

    python -m worldcast.latency_bench.rss --peaks 6 --sessions 8 --out rss_results/
    python -m worldcast.latency_bench.rss --server-flags="--no-heap-trim --malloc-arena-max 0"   # glibc as is

Starts `worldcast serve` in a child process (profile `static`, so every session is admitted) and runs
`--peaks` peaks: each opens `--sessions` sessions at once, half over WebRTC (aiortc peers), half over the
WebSocket stream (fMP4), waits for each one's first frame, lets them stream `--hold` s, deletes them all,
waits `--settle` s (longer than the server's heap-trim delay) and reads the server's RSS with its engine
processes' (`process_resident_memory_bytes` and `worldcast_engine_process_resident_memory_bytes` on
/metrics). The first peak is the warm-up (codecs, thread pools and
caches are made once); every later RSS is compared with the RSS after it. The bar (issue 22): every later
value within 5 % of that first post-warm-up value. The machine is shared: RSS does not depend on load, but
the time each peak takes does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from worldcast.latency_bench import report
from worldcast.latency_bench.server import ServerProfile, metric_samples, resident_bytes, spawn

#: The bar: RSS after each later peak within this share of the first post-warm-up value.
BAR = 0.05


async def rss_bytes(url: str) -> float:
    """The server's resident memory with its engine processes' (`server.resident_bytes`), bytes, from its
    /metrics.

    Raises:
        RuntimeError: the server exports no `process_resident_memory_bytes`.
    """
    b = resident_bytes(await metric_samples(url))
    if b != b:  # NaN
        raise RuntimeError(f"no process_resident_memory_bytes on {url}/metrics")
    return b


async def peak(url: str, *, sessions: int, hold_s: float, seed: int, kinds: str = "both") -> dict[str, Any]:
    """One peak: open `sessions` sessions (half WebRTC, half stream; or all of one `kinds`), stream `hold_s`,
    delete them all."""
    from worldcast.transport.clients import StreamClient, WebRTCClient

    t0 = time.monotonic()
    n_rtc = {"both": sessions // 2, "webrtc": sessions, "stream": 0}[kinds]
    opened: list[Any] = await asyncio.gather(
        *[WebRTCClient.connect(url, seed=seed + i) for i in range(n_rtc)],
        *[StreamClient.connect(url, seed=seed + 100 + i) for i in range(sessions - n_rtc)])
    try:
        await asyncio.gather(*[c.next_frame(timeout_s=60) for c in opened])
        end = time.monotonic() + hold_s
        while time.monotonic() < end:  # keep reading so nothing queues up on the clients
            await asyncio.gather(*[c.next_frame(timeout_s=30) for c in opened])
    finally:
        await asyncio.gather(*[c.aclose() for c in opened], return_exceptions=True)
    return {"sessions": sessions, "webrtc": n_rtc, "stream": sessions - n_rtc, "took_s": time.monotonic() - t0}


async def run(url: str, *, peaks: int, sessions: int, hold_s: float, settle_s: float,
              kinds: str = "both") -> dict[str, Any]:
    start = await rss_bytes(url)
    rows = []
    for k in range(peaks):
        p = await peak(url, sessions=sessions, hold_s=hold_s, seed=1000 * k, kinds=kinds)
        await asyncio.sleep(settle_s)
        p["rss_mib"] = (await rss_bytes(url)) / 2**20
        rows.append(p)
        print(f"peak {k + 1}/{peaks}: RSS {p['rss_mib']:.1f} MiB after {p['took_s']:.1f} s", file=sys.stderr)
    base = rows[0]["rss_mib"]
    for r in rows:
        r["vs_first_post_warmup"] = r["rss_mib"] / base - 1
    later = [r["vs_first_post_warmup"] for r in rows[1:]]
    return {"start_rss_mib": start / 2**20, "peaks": rows, "first_post_warmup_mib": base,
            "max_growth": max(later) if later else 0.0, "bar": BAR,
            "bar_met": all(g <= BAR for g in later)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.rss", description=__doc__.split("\n\n")[0])
    p.add_argument("--peaks", type=int, default=6, help="peaks, the first of them the warm-up")
    p.add_argument("--sessions", type=int, default=8, help="sessions per peak (half WebRTC, half stream)")
    p.add_argument("--hold", type=float, default=3.0, help="s each peak streams")
    p.add_argument("--settle", type=float, default=4.0, help="s after a peak before RSS is read")
    p.add_argument("--kinds", choices=("both", "webrtc", "stream"), default="both",
                   help="the sessions' transports: half WebRTC and half stream (default), or all of one")
    p.add_argument("--server-flags", default="", help="more `worldcast serve` flags (one string)")
    p.add_argument("--out", type=Path, default=None, help="report folder (default rss_results/<time>/)")
    a = p.parse_args(argv)
    if a.peaks < 2 or a.sessions < 1 or a.hold < 0 or a.settle < 0:
        p.error("--peaks must be >= 2, --sessions >= 1, --hold and --settle >= 0")
    profile = ServerProfile.parse(f"static:max_sessions={max(16, a.sessions)}")
    with spawn(profile, extra_flags=shlex.split(a.server_flags)) as url:
        res = asyncio.run(run(url, peaks=a.peaks, sessions=a.sessions, hold_s=a.hold, settle_s=a.settle,
                              kinds=a.kinds))
    res["server_flags"], res["kinds"] = a.server_flags, a.kinds
    out = a.out or Path("rss_results") / time.strftime("%Y%m%d-%H%M%S")
    report.write_json(out / "report.json", res)
    print(json.dumps(report._strict(res), indent=1))
    return 0 if res["bar_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
