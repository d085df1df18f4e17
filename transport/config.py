"""ServerConfig: every setting of a worldcast server, with units."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from worldcast.engine.device_worker import EngineConfig
from worldcast.models.base import WorldModel
from worldcast.sessions.manager import SessionConfig

#: The built browser demo, beside the package folders in a source checkout.
DEFAULT_STATIC_DIR = Path(__file__).resolve().parents[1] / "web_demo" / "dist"


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server process."""

    host: str = "127.0.0.1"  #: HTTP bind address
    port: int = 8000  #: HTTP port
    weights: Path | None = None  #: model weights (None: the shipped TinyWorld weights)
    device: str = "cpu"  #: torch device of the model and KV pool
    video_scale: int = 4  #: integer upscale of published video (64 px frames -> 256 px)
    ice_host_addresses: list[str] | None = None  #: addresses for host ICE candidates (None: see `from_host`)
    static_dir: Path | None = DEFAULT_STATIC_DIR  #: built web demo to serve at / (None: none)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} out of range")
        if not 1 <= self.video_scale <= 8:
            raise ValueError("video_scale must be within 1..8")

    @staticmethod
    def default_ice_hosts(host: str) -> list[str] | None:
        """Pin ICE to the bind address when it is loopback (aioice skips loopback otherwise)."""
        try:
            return [host] if ipaddress.ip_address(host).is_loopback else None
        except ValueError:
            return ["127.0.0.1"] if host == "localhost" else None

    def load_model(self) -> WorldModel:
        """Load the configured model (TinyWorld)."""
        from worldcast.models.tinyworld import TinyWorldModel

        return TinyWorldModel.from_pretrained(self.weights, device=self.device)
