"""LiveKitConfig: where the LiveKit server is and how sessions publish to it."""

from __future__ import annotations

import argparse
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass


class SourceKind(enum.StrEnum):
    """How frames reach LiveKit.

    RAW: uint8 frames to `rtc.VideoSource`; the SDK's libwebrtc encodes (VP8), adapting bitrate
        to congestion and answering keyframe requests itself.
    ENCODED: one H.264 encode here (PyAV, libx264 zerolatency) to `rtc.EncodedVideoSource`
        (pre-encoded backend, no simulcast), which other sinks could share.
    """

    RAW = "raw"
    ENCODED = "encoded"


#: Environment variables read by `LiveKitConfig.from_env` (the names LiveKit's own tools use).
ENV_URL, ENV_API_KEY, ENV_API_SECRET = "LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET"


@dataclass(frozen=True)
class LiveKitConfig:
    """Settings of the LiveKit edge of one server."""

    url: str  #: LiveKit server URL SDKs connect to (ws:// or wss://; http(s):// for the server API is derived)
    api_key: str  #: API key that signs access tokens
    api_secret: str  #: its secret
    user_token_ttl_s: float = 300.0  #: lifetime of the user's access token, s (only joining needs it valid)
    world_token_ttl_s: float = 3600.0  #: lifetime of the world's own token, s
    source: SourceKind = SourceKind.RAW  #: how frames reach LiveKit (see `SourceKind`)
    max_bitrate_bps: int = 1_500_000  #: video encoder ceiling, bits/s
    join_timeout_s: float = 15.0  #: longest wait for the world's room connection, s

    def __post_init__(self) -> None:
        if not self.url.startswith(("ws://", "wss://", "http://", "https://")):
            raise ValueError(f"LiveKit URL must start with ws://, wss://, http:// or https://, got {self.url!r}")
        if not self.api_key or not self.api_secret:
            raise ValueError("LiveKit API key and secret must not be empty")
        if not 10.0 <= self.user_token_ttl_s <= 86_400.0 or not 10.0 <= self.world_token_ttl_s <= 86_400.0:
            raise ValueError("token lifetimes must lie within 10 s .. 24 h")
        if self.max_bitrate_bps < 50_000:
            raise ValueError("max_bitrate_bps must be >= 50000")
        if self.join_timeout_s <= 0:
            raise ValueError("join_timeout_s must be > 0")

    @property
    def ws_url(self) -> str:
        """The URL for SDK connections (ws:// or wss://)."""
        return self.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)

    @property
    def http_url(self) -> str:
        """The URL of the server API (http:// or https://)."""
        return self.url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)

    @classmethod
    def from_options(cls, url: str | None, api_key: str | None, api_secret: str | None, *,
                     env: Mapping[str, str] | None = None, **kw: object) -> LiveKitConfig | None:
        """Command-line values, falling back on LIVEKIT_URL / LIVEKIT_API_KEY / LIVEKIT_API_SECRET.

        Returns:
            None when no URL is given either way (LiveKit off).

        Raises:
            ValueError: a URL without a key and secret, or a bad value.
        """
        env = os.environ if env is None else env
        url = url or env.get(ENV_URL) or None
        if url is None:
            return None
        key, secret = api_key or env.get(ENV_API_KEY), api_secret or env.get(ENV_API_SECRET)
        if not key or not secret:
            raise ValueError(f"LiveKit at {url}: give --livekit-api-key and --livekit-api-secret "
                             f"(or {ENV_API_KEY} and {ENV_API_SECRET})")
        return cls(url=url, api_key=key, api_secret=secret, **kw)  # type: ignore[arg-type]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The LiveKit options of `worldcast serve` (and `worldcast worker`)."""
    g = p.add_argument_group("LiveKit", f"sessions created with \"transport\": \"livekit\" (defaults from {ENV_URL}, "
                                        f"{ENV_API_KEY}, {ENV_API_SECRET})")
    g.add_argument("--livekit-url", default=None, metavar="URL", help="LiveKit server, e.g. ws://127.0.0.1:7880")
    g.add_argument("--livekit-api-key", default=None, metavar="KEY", help="API key that signs access tokens")
    g.add_argument("--livekit-api-secret", default=None, metavar="SECRET", help="its secret")
    g.add_argument("--livekit-source", choices=[k.value for k in SourceKind], default=SourceKind.RAW.value,
                   help="raw: frames to the SDK, which encodes (VP8); encoded: one H.264 encode here (PyAV)")
    g.add_argument("--livekit-token-ttl", type=float, default=300.0, metavar="S",
                   help="lifetime of the user's access token, s")


def from_arguments(args: argparse.Namespace, *, env: Mapping[str, str] | None = None) -> LiveKitConfig | None:
    """`LiveKitConfig` from `add_arguments`' options (None: no URL given, LiveKit off).

    Raises:
        ValueError: a URL without key and secret, or a bad value.
    """
    return LiveKitConfig.from_options(args.livekit_url, args.livekit_api_key, args.livekit_api_secret, env=env,
                                      source=SourceKind(args.livekit_source), user_token_ttl_s=args.livekit_token_ttl)


@dataclass(frozen=True)
class AgentWorkerConfig:
    """Settings of `worldcast worker` (see `worker.py`)."""

    agent_name: str = "worldcast"  #: the name dispatches ask for (CreateAgentDispatchRequest.agent_name)
    status_interval_s: float = 2.0  #: status and load are reported at least this often, s
    assignment_timeout_s: float = 15.0  #: an accepted job's session is released if no assignment follows, s
    decline_watch_s: float = 3.0  #: after declining, how long to watch for another worker taking the dispatch, s
    decline_poll_s: float = 0.25  #: how often to look meanwhile, s
    reconnect_min_s: float = 0.5  #: first reconnect delay, s (doubling up to reconnect_max_s)
    reconnect_max_s: float = 10.0  #: longest reconnect delay, s

    def __post_init__(self) -> None:
        if not self.agent_name or len(self.agent_name) > 128:
            raise ValueError("agent_name must be 1-128 characters")
        if min(self.status_interval_s, self.assignment_timeout_s, self.decline_watch_s, self.decline_poll_s,
               self.reconnect_min_s) <= 0 or self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("worker intervals must be > 0 (and reconnect_max_s >= reconnect_min_s)")
