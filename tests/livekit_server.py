"""The test LiveKit server: `latency_bench/livekit_server.py` (the benchmark starts the same one)."""

from worldcast.latency_bench.livekit_server import (  # noqa: F401
    DEFAULT_BINARY,
    LiveKitServer,
    binary,
    run_livekit_server,
)
