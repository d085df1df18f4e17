"""ServerConfig: every setting of a worldcast server, with units."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from pathlib import Path

from worldcast.engine.device_worker import EngineConfig
from worldcast.models.base import WorldModel
from worldcast.sessions.manager import SessionConfig
from worldcast.transport.conn_limits import ConnectionLimits
from worldcast.transport.limits import InputLimits
from worldcast.transport.livekit.config import AgentWorkerConfig, LiveKitConfig
from worldcast.transport.memory import MemoryConfig
from worldcast.transport.metrics import MetricsConfig

logger = logging.getLogger(__name__)

#: Model families `worldcast serve --model` knows.
MODELS = ("tinyworld", "causal-wan", "causal-wan:tiny")

#: The built browser demo, beside the package folders in a source checkout.
DEFAULT_STATIC_DIR = Path(__file__).resolve().parents[1] / "web_demo" / "dist"


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server process."""

    host: str = "127.0.0.1"  #: HTTP bind address
    port: int = 8000  #: HTTP port
    model: str = "tinyworld"  #: model family: "tinyworld", "causal-wan" (needs `weights`) or "causal-wan:tiny"
    weights: Path | None = None  #: model weights (None: the shipped TinyWorld weights)
    wan_preset: str = "longlive-1.3b"  #: causal-wan: window/sink/timestep preset (models/causal_wan/config.PRESETS)
    wan_base: Path | None = None  #: causal-wan: diffusers folder with the VAE and text encoder for a `.pt` DiT
    device: str = "cpu"  #: torch device of the model and state pool
    video_scale: int | None = None  #: integer upscale of published video (None: up to ~256 px high)
    ice_host_addresses: list[str] | None = None  #: addresses for host ICE candidates (None: see `from_host`)
    static_dir: Path | None = DEFAULT_STATIC_DIR  #: built web demo to serve at / (None: none)
    dreamverse_segment_s: float = 5.0  #: segment length of the Dreamverse-compatible endpoint (WS /ws), s
    dreamverse_session_timeout_s: float = 3600.0  #: a Dreamverse client's session ends after this, s
    engine: EngineConfig = field(default_factory=EngineConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)
    livekit: LiveKitConfig | None = None  #: LiveKit server for `"transport": "livekit"` sessions (None: off)
    agent: AgentWorkerConfig | None = None  #: register with `livekit` as an agent worker (None: don't)
    negotiation_timeout_s: float = 15.0  #: an answered peer not `connected` after this is closed, s
    ice_consent_timeout_s: float | None = None  #: a peer silent to ICE consent checks this long is closed, s (None: 30)
    input_limits: InputLimits = field(default_factory=InputLimits)  #: per-connection rates, sizes, flood policy
    metrics: MetricsConfig = field(default_factory=MetricsConfig)  #: the metrics listener and per-session series
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)  #: request-head timeout, per-client cap
    memory: MemoryConfig = field(default_factory=MemoryConfig)  #: malloc arenas, heap trim after closes

    def __post_init__(self) -> None:
        if self.agent is not None and self.livekit is None:
            raise ValueError("an agent worker needs a LiveKit server (livekit)")
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} out of range")
        if self.video_scale is not None and not 1 <= self.video_scale <= 8:
            raise ValueError("video_scale must be within 1..8")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {sorted(MODELS)}")
        if self.model == "causal-wan" and self.weights is None:
            raise ValueError("--model causal-wan needs --weights (a diffusers folder or a Self-Forcing .pt); "
                             "causal-wan:tiny runs without (random weights)")
        if not 0 < self.dreamverse_segment_s <= 600 or not self.dreamverse_session_timeout_s > 0:
            raise ValueError("dreamverse_segment_s must lie in (0, 600] and dreamverse_session_timeout_s be > 0")
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

    def load_model(self) -> WorldModel:
        """Load the configured model.

        Raises:
            FileNotFoundError / ValueError: missing or malformed weights (the message names what).
        """
        if self.model == "tinyworld":
            from worldcast.models.tinyworld import TinyWorldModel

            return TinyWorldModel.from_pretrained(self.weights, device=self.device)
        import torch

        from worldcast.models.causal_wan.config import PRESETS
        from worldcast.models.causal_wan.loading import load_parts, tiny_parts
        from worldcast.models.causal_wan.model import CausalWanModel

        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        if self.model == "causal-wan:tiny":
            parts = tiny_parts(dtype=dtype, device=self.device)
            logger.warning("causal-wan:tiny has RANDOM weights: it streams noise-like video (for trying the path)")
        else:
            assert self.weights is not None
            parts = load_parts(self.weights, cfg=PRESETS[self.wan_preset](), base_folder=self.wan_base,
                               dtype=dtype, device=self.device)
        name = self.model if self.model.endswith("tiny") else f"causal-wan:{self.wan_preset}"
        return CausalWanModel(parts, name=name)
