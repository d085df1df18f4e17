"""`mtp --transport livekit`: motion-to-photon through the SFU beside direct WebRTC, in one run.

Without --url the run starts a livekit-server (dev mode, loopback; the binary
`make livekit-server` builds, see `livekit_server.py`) and one `worldcast
serve` wired to it, then measures the same workload twice against that one
server: over direct WebRTC (aiortc client) and through LiveKit (the Python
SDK as each session's user; stamps read from the frames it decodes). With
--url the running server must have LiveKit configured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from worldcast.latency_bench import mtp as mtp_mod
from worldcast.latency_bench.livekit_server import DEFAULT_BINARY, binary, run_livekit_server
from worldcast.latency_bench.server import ServerProfile, spawn


@contextlib.contextmanager
def server_with_livekit(profile: ServerProfile, source: str) -> Iterator[str]:
    """A livekit-server and a worldcast server joined to it; yields the worldcast URL.

    Raises:
        RuntimeError: livekit-server is not built, or a server did not start.
    """
    exe = binary()
    if exe is None:
        raise RuntimeError(f"livekit-server is not built ({DEFAULT_BINARY}): run `make livekit-server`")
    with run_livekit_server(exe) as lk, spawn(profile, extra_flags=[
            "--livekit-url", lk.url, "--livekit-api-key", lk.api_key, "--livekit-api-secret", lk.api_secret,
            "--livekit-source", source]) as url:
        yield url


def run(url: str | None, profile: ServerProfile, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both transports, one after the other, against one server: a result dict each (as `run_mtp`'s)."""
    out = []
    with (contextlib.nullcontext(url) if url else server_with_livekit(profile, args.livekit_source)) as u:
        for transport in ("webrtc", "livekit"):
            res = asyncio.run(mtp_mod.run(u, sessions=args.sessions, seconds=args.seconds, action_hz=args.action_hz,
                                          transport=transport))
            label = transport if transport == "webrtc" else f"livekit-{args.livekit_source}"
            out.append({"profile": profile.name, "transport": label, "summary": mtp_mod.report(res),
                        "samples_ms": [x for r in res for x in r.mtp_ms]})
    return out
