"""Frame accounting under a CPU burner: every segment's `frames` equals the media segments that arrived.

    .venv/bin/python -m tests.frame_drops [--burners N] [--segments K] [--seconds S]

Starts a server with TinyWorld on 127.0.0.1, loads every core with N busy processes (default: the core
count), plays K directed segments of S seconds over the WebSocket stream and checks, per segment, that
`segment_complete.frames` is the number of its media segments received and `frames + dropped` the frames
handed to the stream; prints each segment's counts and the stream's drop reasons from /metrics. Exits 1 on
a mismatch. A check of the accounting, not a benchmark: the drops depend on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import urllib.request
from typing import Any

from tests.conftest import _serve, server_config
from worldcast.transport.clients import StreamClient


def _burn() -> None:  # pragma: no cover - a child process
    while True:
        pass


async def _play(url: str, segments: int, seconds: float) -> list[tuple[dict[str, Any], int]]:
    out = []
    async with await StreamClient.connect(url, mode="directing", seed=3) as c:
        for k in range(segments):
            await c.direct(f"a green meadow, take {k}", duration_s=seconds)
            done = await c.wait_event(lambda e, k=k: e["event"] == "segment_complete" and e["segment"] == k,
                                      timeout_s=120 + 20 * seconds)
            got = sum(1 for e in c.events if e["event"] == "media" and e.get("segment") == k)
            out.append((done, got))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--segments", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    from worldcast.models.tinyworld import TinyWorldModel

    gen = _serve(server_config(), TinyWorldModel.from_pretrained())
    srv = next(gen)
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    try:
        results = asyncio.run(_play(srv.url, args.segments, args.seconds))
    finally:
        for b in burners:
            b.terminate()
        with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
            counts = [ln for ln in r.read().decode().splitlines() if ln.startswith("worldcast_stream_frames_total")]
        gen.close()
    bad = 0
    for done, got in results:
        ok = done["frames"] == got
        bad += not ok
        print(f"segment {done['segment']}: frames {done['frames']} (media received {got}), dropped "
              f"{done['dropped']}, target {done['target_frames']}, end {done['end']}{'' if ok else '  MISMATCH'}")
    print("\n".join(counts))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
