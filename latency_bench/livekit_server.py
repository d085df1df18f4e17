"""A real livekit-server for tests and benchmarks: dev mode, loopback only, free ports.

The binary is built by `make livekit-server` (`go install
github.com/livekit/livekit-server/cmd/server@v1.13.5`, cached under
~/.cache/worldcast/); `WORLDCAST_LIVEKIT_SERVER` names another one.

Media stays on loopback: `--dev --bind 127.0.0.1` alone still advertises an
auto-detected non-loopback node IP, so the server also gets `--node-ip
127.0.0.1` and an rtc config with the loopback candidate on, the external
IP off and only 127.0.0.1/32 included (field names from livekit-server's
pkg/config/config.go and mediatransportutil's pkg/rtcconfig/config.go).
Rooms ask subscribers for no playout delay (`room.playout_delay` 0/0), the
setting for interactive video.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

LIVEKIT_VERSION = "v1.13.5"
#: Where `make livekit-server` puts the binary.
DEFAULT_BINARY = Path.home() / ".cache" / "worldcast" / f"livekit-server-{LIVEKIT_VERSION}" / "server"
#: Keys of `--dev` mode.
DEV_API_KEY, DEV_API_SECRET = "devkey", "secret"
#: How long the server may take to answer its health check, s.
READY_TIMEOUT_S = 30.0
#: How long it may take to stop after SIGTERM, s.
STOP_TIMEOUT_S = 10.0


def binary() -> Path | None:
    """The livekit-server binary, or None when it is not built."""
    p = Path(os.environ.get("WORLDCAST_LIVEKIT_SERVER") or DEFAULT_BINARY)
    return p if p.is_file() and os.access(p, os.X_OK) else None


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_tcp_udp_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (livekit muxes ICE/UDP on one port)."""
    for _ in range(50):
        port = _free_port(socket.SOCK_DGRAM)
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port))
            return port
    raise RuntimeError("no port free for both TCP and UDP")


@dataclass(frozen=True)
class LiveKitServer:
    """A running livekit-server.

    Attributes:
        url: its WebSocket URL (ws://127.0.0.1:port), what SDKs connect to.
        http_url: the same port over HTTP (health check, server API).
        api_key, api_secret: the dev-mode key pair.
        log_path: its combined stdout/stderr.
    """

    url: str
    http_url: str
    api_key: str
    api_secret: str
    log_path: str
    process: subprocess.Popen  # type: ignore[type-arg]

    def log_head(self, chars: int = 20_000) -> str:
        """The start of its log (start-up lines)."""
        with open(self.log_path, errors="replace") as f:
            return f.read(chars)

    def log_tail(self, chars: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-chars:]


def config_body(*, port: int, rtc_tcp_port: int, rtc_udp_port: int) -> str:
    """The YAML config: loopback signalling and media on the given ports."""
    return "\n".join([
        f"port: {port}",
        "bind_addresses: [127.0.0.1]",
        "rtc:",
        f"  tcp_port: {rtc_tcp_port}",
        f"  udp_port: {rtc_udp_port}",
        "  use_external_ip: false",
        "  enable_loopback_candidate: true",
        "  ips:",
        "    includes: [127.0.0.1/32]",
        # playout-delay RTP header extension 0/0 on subscribed video: receivers render a frame as soon as
        # it is decoded instead of holding it in their jitter buffer (livekit-server pkg/sfu/playoutdelay.go)
        "room:",
        "  playout_delay: {enabled: true, min: 0, max: 0}",
        "",
    ])


@contextlib.contextmanager
def run_livekit_server(exe: Path) -> Iterator[LiveKitServer]:
    """Start livekit-server in dev mode on free loopback ports; stop it on exit.

    Raises:
        RuntimeError: it exited or did not answer its health check within READY_TIMEOUT_S (log quoted).
    """
    port, tcp, udp = _free_port(socket.SOCK_STREAM), _free_port(socket.SOCK_STREAM), free_tcp_udp_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="livekit-server-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [str(exe), "--dev", "--bind", "127.0.0.1", "--node-ip", "127.0.0.1",
           "--config-body", config_body(port=port, rtc_tcp_port=tcp, rtc_udp_port=udp)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = LiveKitServer(f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{port}", DEV_API_KEY, DEV_API_SECRET,
                           log.name, proc)
    failed = True
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"livekit-server exited ({proc.returncode}): {server.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"livekit-server not ready after {READY_TIMEOUT_S:.0f} s: {server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.http_url + "/", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield server
        failed = False
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if not failed:
            os.unlink(log.name)
