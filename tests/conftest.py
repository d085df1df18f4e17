"""Shared fixtures: the shipped model, and a real server on a loopback port."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:  # the network edge (pydantic, fastapi) is imported by the fixtures that serve, not here:
    # the device check runs tests/gpu on an image without those packages (latency_bench/gpu_check/)
    from worldcast.transport.config import ServerConfig

torch.set_num_threads(1)  # 2 cores: leave one for the event loop, aiortc and the browser
# Engines in tests (and the servers they spawn) run float32, eager, unless a test asks otherwise: compiling
# takes minutes on a cold cache, and the shared `model` fixture must stay in its reference precision.
os.environ.setdefault("WORLDCAST_COMPILE", "0")
os.environ.setdefault("WORLDCAST_PRECISION", "float32")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep each phase's report on the test item (`item.rep_call`...), for fixtures that act on a failure."""
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="session")
def model():  # type: ignore[no-untyped-def]
    """The shipped TinyWorld model (loaded once per test run)."""
    from worldcast.models.tinyworld import TinyWorldModel

    return TinyWorldModel.from_pretrained()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    """A running worldcast server: base URL and the in-process app (to inspect state)."""

    url: str
    app: object
    config: ServerConfig

    @property
    def manager(self):  # type: ignore[no-untyped-def]
        return self.app.state.manager  # type: ignore[attr-defined]


def _serve(config: ServerConfig, model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    import uvicorn

    from worldcast.transport.http.app import create_app
    from worldcast.transport.http.conn_limits import GuardStats, serve_config

    app = create_app(config, model=model)
    stats = GuardStats()  # the connection guard's counts, for the tests that probe it
    app.state.connection_guard = stats
    # the uvicorn settings `worldcast serve` runs with (request-head timeout, per-client connection cap)
    server = uvicorn.Server(serve_config(app, host=config.host, port=config.port, limits=config.connections,
                                         log_level="warning", stats=stats))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # warm-up measures step costs: slow on a busy 2-core machine
    while not server.started:
        assert time.monotonic() < deadline, "server did not start within 120 s"
        assert thread.is_alive(), "server thread died"
        time.sleep(0.05)
    try:
        yield LiveServer(f"http://{config.host}:{config.port}", app, config)
    finally:
        server.should_exit = True
        thread.join(15)


def server_config(**overrides) -> ServerConfig:  # type: ignore[no-untyped-def]
    from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
    from worldcast.engine.device_worker import EngineConfig
    from worldcast.sessions.manager import SessionConfig
    from worldcast.sessions.recording import RecordingConfig
    from worldcast.sessions.snapshots import SnapshotConfig
    from worldcast.transport.config import ServerConfig

    base = ServerConfig(
        host="127.0.0.1",
        port=free_port(),
        ice_host_addresses=["127.0.0.1"],
        video_scale=2,
        engine=EngineConfig(state_budget_bytes=64 * 2**20, max_batch=4, torch_threads=1),
        sessions=SessionConfig(
            idle_after_s=60.0, timeout_s=120.0,
            admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=8),
        ),
        # each server its own recordings directory, never the user's
        recordings=RecordingConfig(Path(tempfile.mkdtemp(prefix="worldcast-recordings-"))),
        snapshots=SnapshotConfig(Path(tempfile.mkdtemp(prefix="worldcast-snapshots-"))),
    )
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def live_server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    """A real server on 127.0.0.1 with the shipped model, ICE pinned to loopback."""
    yield from _serve(server_config(), model)


@pytest.fixture(scope="session")
def livekit_server():  # type: ignore[no-untyped-def]
    """A real livekit-server (dev mode, loopback, free ports) for the whole run.

    Skipped when the binary is not built (`make livekit-server`; `make test` builds it),
    except in CI (env CI set), where that fails.
    """
    import os

    from tests.livekit_server import DEFAULT_BINARY, binary, run_livekit_server

    exe = binary()
    if exe is None:
        why = f"livekit-server is not built ({DEFAULT_BINARY}; `make livekit-server` builds it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    with run_livekit_server(exe) as server:
        yield server
