"""ServerConfig: every setting of a worldcast server, with units."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from worldcast.engine.device_worker import EngineConfig
from worldcast.engine.process.client import RestartPolicy
from worldcast.models import registry
from worldcast.models.base import WorldModel
from worldcast.sessions.manager import SessionConfig
from worldcast.sessions.recording import RecordingConfig
from worldcast.sessions.snapshots import SnapshotConfig
from worldcast.sessions.viewers import ViewerConfig
from worldcast.transport.http.conn_limits import ConnectionLimits
from worldcast.transport.http.metrics import MetricsConfig
from worldcast.transport.limits import InputLimits
from worldcast.transport.livekit.config import AgentWorkerConfig, LiveKitConfig
from worldcast.transport.memory import MemoryConfig

#: The built browser demo, beside the package folders in a source checkout.
DEFAULT_STATIC_DIR = Path(__file__).resolve().parents[1] / "web_demo" / "dist"


#: The recordings directory unless `--recordings-dir` says another.
DEFAULT_RECORDINGS_DIR = Path.home() / ".cache" / "worldcast" / "recordings"
#: The snapshots directory unless `--snapshots-dir` says another.
DEFAULT_SNAPSHOTS_DIR = Path.home() / ".cache" / "worldcast" / "snapshots"


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server process."""

    host: str = "127.0.0.1"  #: HTTP bind address
    port: int = 8000  #: HTTP port
    model: str = registry.DEFAULT_MODEL  #: "NAME[:VARIANT]" of a registered family (`models/registry.py`)
    weights: Path | None = None  #: model weights (None: the variant's default, e.g. the shipped TinyWorld weights)
    #: the family's own options by key (`ModelOption.key`, e.g. {"wan_preset": "longlive-1.3b"}); missing: defaults
    model_options: dict[str, object] = field(default_factory=dict)
    device: str = "cpu"  #: torch device of the model and state pool
    video_scale: int | None = None  #: integer upscale of published video (None: up to ~256 px high)
    ice_host_addresses: list[str] | None = None  #: addresses for host ICE candidates (None: see `from_host`)
    static_dir: Path | None = DEFAULT_STATIC_DIR  #: built web demo to serve at / (None: none)
    dreamverse_segment_s: float = 5.0  #: segment length of the Dreamverse-compatible endpoint (WS /ws), s
    dreamverse_session_timeout_s: float = 3600.0  #: a Dreamverse client's session ends after this, s
    dreamverse_segment_cap: int = 6  #: segments per Dreamverse rollout before `ltx2_stream_complete` (0: none)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)
    livekit: LiveKitConfig | None = None  #: LiveKit server for `"transport": "livekit"` sessions (None: off)
    agent: AgentWorkerConfig | None = None  #: register with `livekit` as an agent worker (None: don't)
    negotiation_timeout_s: float = 15.0  #: an answered peer not `connected` after this is closed, s
    ice_consent_timeout_s: float | None = None  #: a peer silent to ICE consent checks this long is closed, s (None: 30)
    input_limits: InputLimits = field(default_factory=InputLimits)  #: per-connection rates, sizes, flood policy
    #: engine cores on `device` (a CPU host: each takes its share of the cores); ignored when `devices` is given
    engines: int = 1
    #: one engine core per device, e.g. ("cuda:0", "cuda:1") (empty: `engines` on `device`)
    devices: tuple[str, ...] = ()
    #: run each engine core in a process of its own (crash-isolated, restarted); None: only when there are several
    engine_processes: bool | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)  #: when a lost engine process is started again
    admin_token: str | None = None  #: bearer token of the operator routes (drain, move); None: those routes are off
    metrics: MetricsConfig = field(default_factory=MetricsConfig)  #: the metrics listener and per-session series
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)  #: request-head timeout, per-client cap
    memory: MemoryConfig = field(default_factory=MemoryConfig)  #: malloc arenas, heap trim after closes
    viewers: ViewerConfig = field(default_factory=ViewerConfig)  #: viewer tokens' lifetimes, spectators' caps
    #: where sessions asked to record are recorded and how much they may take (None: recording is refused)
    recordings: RecordingConfig | None = field(default_factory=lambda: RecordingConfig(DEFAULT_RECORDINGS_DIR))
    #: where snapshots are kept and how many (None: snapshots are refused)
    snapshots: SnapshotConfig | None = field(default_factory=lambda: SnapshotConfig(DEFAULT_SNAPSHOTS_DIR))

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError("engines must be >= 1")
        if self.devices and len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices must be distinct: {list(self.devices)}")
        if self.admin_token is not None and len(self.admin_token) < 16:
            raise ValueError("admin_token must be at least 16 characters")
        if self.agent is not None and self.livekit is None:
            raise ValueError("an agent worker needs a LiveKit server (livekit)")
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} out of range")
        if self.video_scale is not None and not 1 <= self.video_scale <= 8:
            raise ValueError("video_scale must be within 1..8")
        try:
            registry.check_request(self.model, weights=self.weights, options=self.model_options)
        except registry.UnknownModel as e:
            raise ValueError(str(e)) from None
        if not 0 < self.dreamverse_segment_s <= 600 or not self.dreamverse_session_timeout_s > 0:
            raise ValueError("dreamverse_segment_s must lie in (0, 600] and dreamverse_session_timeout_s be > 0")
        if not 0 <= self.dreamverse_segment_cap <= 10_000:
            raise ValueError(f"dreamverse_segment_cap must lie in [0, 10000], got {self.dreamverse_segment_cap}")
        if not 0 < self.negotiation_timeout_s < float("inf"):
            raise ValueError("negotiation_timeout_s must be positive and finite")

    @staticmethod
    def default_ice_hosts(host: str) -> list[str] | None:
        """Pin ICE to the bind address when it is loopback (aioice skips loopback otherwise)."""
        try:
            return [host] if ipaddress.ip_address(host).is_loopback else None
        except ValueError:
            return ["127.0.0.1"] if host == "localhost" else None

    def scale_for(self, model: WorldModel) -> int:
        """The video upscale: as configured, else the largest that keeps the video at most ~256 px high."""
        if self.video_scale is not None:
            return self.video_scale
        return max(1, min(8, 256 // model.spec.frame_height))

    @property
    def engine_devices(self) -> list[str]:
        """The device of each engine core, in engine id order."""
        return list(self.devices) if self.devices else [self.device] * self.engines

    @property
    def isolated(self) -> bool:
        """Whether the engine cores run in processes of their own."""
        if self.engine_processes is not None:
            return self.engine_processes
        return len(self.engine_devices) > 1

    def load_model(self) -> WorldModel:
        """Load the configured model through the registry: on `device` when the engine runs in this
        process, else on the CPU (this process then only encodes actions and conditioning).

        Raises:
            FileNotFoundError / ValueError: missing or malformed weights (the message names what).
        """
        device = "cpu" if self.isolated else self.engine_devices[0]
        return registry.load(self.model, weights=self.weights, device=device, options=self.model_options)
