"""worldcast latency benchmark.

    python -m worldcast.latency_bench mtp --sessions 1 --seconds 20

Without --url it starts a server in-process on a free loopback port with the
shipped model (ICE pinned to 127.0.0.1) and measures against it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import threading
import time
from pathlib import Path

from worldcast.latency_bench import mtp


def _spawn_server(max_batch: int, threads: int | None):  # type: ignore[no-untyped-def]
    import uvicorn

    from worldcast.engine.device_worker import EngineConfig
    from worldcast.transport.app import create_app
    from worldcast.transport.config import ServerConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ServerConfig(port=port, ice_host_addresses=["127.0.0.1"],
                       engine=EngineConfig(max_batch=max_batch, torch_threads=threads))
    server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", (server, thread)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("mtp", help="TTFF, frames/s and action-to-frame latency over WebRTC")
    m.add_argument("--url", default=None, help="server base URL (default: start one in-process)")
    m.add_argument("--sessions", type=int, default=1)
    m.add_argument("--seconds", type=float, default=20.0)
    m.add_argument("--action-hz", type=float, default=4.0, help="action messages per second per session")
    m.add_argument("--max-batch", type=int, default=8, help="for the in-process server")
    m.add_argument("--threads", type=int, default=None, help="torch threads of the in-process server")
    m.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    server = None
    url = args.url
    if url is None:
        url, server = _spawn_server(args.max_batch, args.threads)
    try:
        results = asyncio.run(mtp.run(url, sessions=args.sessions, seconds=args.seconds, action_hz=args.action_hz))
    finally:
        if server is not None:
            server[0].should_exit = True
            server[1].join(15)  # let the app close its sessions and stop the device worker
    rep = mtp.report(results) | {"machine": platform.platform(), "seconds": args.seconds}
    width = max(len(k) for k in rep)
    for k, v in rep.items():
        print(f"{k:<{width}}  {v:.1f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.json:
        args.json.write_text(json.dumps(rep, indent=2))


if __name__ == "__main__":
    main()
