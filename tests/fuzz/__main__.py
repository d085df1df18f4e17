"""`python -m tests.fuzz`: fuzz every input surface, pure and against a live server, and write a JSON report.

    python -m tests.fuzz --cases 10000 --live-cases 2000 --out fuzz_report.json

Surfaces: action messages, control RPCs and SDP offers, each through the real parser on a real session
(`--cases` each) and over a real server's data channels / signaling route (`--live-cases` each; SDP: a
tenth of it); a real recording's event log, mutated and replayed (`--cases`; `replay_fuzz.py`); and the HTTP
routes by schemathesis from the server's OpenAPI schema (`--cases`). A second
session streams throughout the live part; a surface fails if it went `MAX_WATCH_GAP_S` without a frame.
Exit status 1 if any surface crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tests.fuzz import harness
from tests.fuzz.strategies import action_messages, control_messages, sdp_offers


def real_offers() -> list[str]:
    """Offers of real aiortc peers: with and without a data channel."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    from worldcast.transport.webrtc.peer import configure_ice

    async def one(dc: bool) -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            if dc:
                pc.createDataChannel("actions")
            pc.addTransceiver("video", direction="recvonly")
            await pc.setLocalDescription(await pc.createOffer())
            return pc.localDescription.sdp
        finally:
            await pc.close()

    configure_ice(["127.0.0.1"])
    return [asyncio.run(one(True)), asyncio.run(one(False))]


async def live(url: str, drawn: dict[str, list[Any]], *, surfaces: set[str]) -> list[harness.SurfaceResult]:
    """The live surfaces, with cases drawn beforehand (`drawn`), so the run itself only sends."""
    from worldcast.transport.clients.webrtc import WebRTCClient

    out = []
    watcher = await WebRTCClient.connect(url, seed=1)
    target = await WebRTCClient.connect(url, seed=2)
    try:
        await watcher.next_frame()
        await target.next_frame()

        def seen() -> list[float]:
            return [e["received_at"] for e in watcher.frame_events]

        if drawn.get("actions"):
            reliable = target.pc.createDataChannel("actions")  # reliable: every fuzz case arrives
            while reliable.readyState != "open":
                await asyncio.sleep(0.01)
            out.append(await harness.fuzz_channel_live(target, reliable, drawn["actions"], "actions",
                                                       watcher_times=seen))
        if drawn.get("rpc"):
            out.append(await harness.fuzz_channel_live(target, target.control, drawn["rpc"], "rpc",
                                                       watcher_times=seen))
            await target.rpc("resume")  # the fuzz may have paused or cancelled it
        if drawn.get("sdp"):
            out.append(await harness.fuzz_sdp_live(target, drawn["sdp"], watcher_times=seen))
        if drawn.get("http"):
            t0 = time.monotonic()
            r = await asyncio.to_thread(harness.fuzz_http_live, url, drawn["http"], token=target.token,
                                        session_id=target.session_id)
            r.watcher = harness.watch_stats(seen(), t0, time.monotonic())
            if r.watcher["max_gap_s"] > harness.MAX_WATCH_GAP_S:
                r.crash(f"the watching session went {r.watcher['max_gap_s']} s without a frame")
            out.append(r)
        if watcher.pc.connectionState != "connected":
            out[-1].crash(f"the watching session is {watcher.pc.connectionState}")
    finally:
        await target.aclose()
        await watcher.aclose()
    return out


def run(cases: int, live_cases: int, seed: int, surfaces: set[str], *, http_cases: int | None = None,
        progress: Path | None = None) -> dict[str, Any]:
    """Run the fuzz; returns the report (and writes what is done so far to `progress` after each pure surface)."""
    import worldcast.transport.http.app  # noqa: F401 - everything the server needs, imported before a long run
    from tests.conftest import _serve, server_config
    from worldcast.models.tinyworld import TinyWorldModel

    torch.set_num_threads(1)
    model = TinyWorldModel.from_pretrained()
    bases = real_offers()
    results: list[harness.SurfaceResult] = []

    def saved() -> None:
        if progress is not None:
            progress.write_text(json.dumps([r.as_dict() for r in results], indent=2))

    if "actions" in surfaces:
        results.append(harness.fuzz_actions_pure(model, cases, seed))
        saved()
    if "rpc" in surfaces:
        results.append(harness.fuzz_rpc_pure(model, cases, seed))
        saved()
    if "sdp" in surfaces:
        results.append(harness.fuzz_sdp_pure(bases, cases, seed))
        saved()
    if "replay" in surfaces:  # a real recording's log, mutated (tests/fuzz/replay_fuzz.py)
        import tempfile

        from tests.fuzz.replay_fuzz import fuzz_replay, record_log

        with tempfile.TemporaryDirectory(prefix="replay-log-") as tmp:
            results.append(fuzz_replay(record_log(model, Path(tmp)), model, cases, seed))
        saved()
    http_n = (cases if http_cases is None else http_cases) if "http" in surfaces else 0
    from worldcast.transport.http.app import create_app

    drawn: dict[str, list[Any]] = {}  # drawn before the server starts: generation would compete with it
    if live_cases and "actions" in surfaces:
        drawn["actions"] = harness.collect(action_messages, live_cases, seed)
    if live_cases and "rpc" in surfaces:
        drawn["rpc"] = harness.collect(control_messages, live_cases, seed + 1)
    if live_cases and "sdp" in surfaces:
        drawn["sdp"] = harness.collect(sdp_offers(bases), max(1, live_cases // 10), seed + 2)
    config = harness.fuzz_config(server_config())
    if http_n:
        drawn["http"] = harness.http_cases(create_app(config, model=model).openapi(), http_n, seed + 3)
    errors = harness.ServerErrors()
    if drawn:
        with errors.installed():
            gen = _serve(config, model)
            srv = next(gen)
            try:
                results += asyncio.run(live(srv.url, drawn, surfaces=surfaces))
            finally:
                gen.close()
    report = {"cases": cases, "live_cases": live_cases, "seed": seed,
              "surfaces": [r.as_dict() for r in results],
              "server_errors": errors.records[:20], "server_error_count": len(errors.records),
              "crashes": sum(r.crash_count for r in results) + len(errors.records)}
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=10_000, help="cases per pure surface and for HTTP (default 10000)")
    p.add_argument("--live-cases", type=int, default=2_000, help="cases per live data-channel surface (SDP: a tenth)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--surfaces", default="actions,rpc,sdp,replay,http")
    p.add_argument("--out", type=Path, default=Path("fuzz_report.json"))
    a = p.parse_args(argv)
    if a.cases < 1 or a.live_cases < 0:
        p.error("--cases must be >= 1 and --live-cases >= 0")
    report = run(a.cases, a.live_cases, a.seed, set(a.surfaces.split(",")),
                 progress=a.out.with_suffix(".partial.json"))
    a.out.write_text(json.dumps(report, indent=2))
    for r in report["surfaces"]:
        print(f"{r['surface']:8s} {r['level']:5s} cases {r['cases']:6d}  crashes {r['crash_count']}  "
              f"{r['seconds']:.0f} s  watcher {r['watcher'] or '-'}")
    print(f"server errors logged: {report['server_error_count']}; report: {a.out}")
    return 1 if report["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
