"""The contract between a world model and the engine: its declared geometry.

A model declares everything the engine needs to plan memory and time up
front, in a `WorldModelSpec`; it holds no per-session state of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class KVGeometry:
    """Shape of one session's KV cache.

    The cache holds `sink_frames` attention-sink frames (the session's first
    frames, kept forever) plus a rolling window of the last `window_frames`
    committed frames, each `tokens_per_frame` tokens, for `layers` layers of
    `heads` heads of `head_dim` values, keys and values both.
    """

    layers: int  #: transformer layers with a cache
    heads: int  #: attention heads per layer
    head_dim: int  #: values per head
    tokens_per_frame: int  #: key tokens per frame
    window_frames: int  #: rolling-window frames
    sink_frames: int  #: attention-sink frames

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "head_dim", "tokens_per_frame", "window_frames"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVGeometry.{name} must be positive")
        if self.sink_frames < 0:
            raise ValueError("KVGeometry.sink_frames must be >= 0")

    @property
    def capacity_frames(self) -> int:
        """Frames held at most: sink plus window."""
        return self.sink_frames + self.window_frames

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_frames * self.tokens_per_frame

    def bytes_per_session(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V for one session at full capacity."""
        return 2 * self.layers * self.heads * self.capacity_tokens * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class ActionSpace:
    """Keyboard keys and mouse axes a model understands.

    `dim` is the length of the model's action vector.
    """

    keys: tuple[str, ...]  #: key names, e.g. ("w", "a", "s", "d", "space", "shift")
    mouse_axes: int = 2  #: mouse dx, dy
    dim: int = 8  #: length of the action vector


@dataclass(frozen=True)
class WorldModelSpec:
    """Geometry of a causal video world model, declared up front.

    Latents of one frame are `latent_shape` = (C, h, w). A chunk is
    `frames_per_chunk` frames denoised together over `timesteps` (descending
    flow times; one denoising step per entry), then committed to the KV cache.
    """

    name: str  #: model family and size, e.g. "tinyworld-2m"
    frame_height: int  #: pixels
    frame_width: int  #: pixels
    fps: int  #: frames per second of generated video (Hz)
    frames_per_chunk: int  #: frames generated together
    timesteps: tuple[float, ...]  #: flow times of the denoising steps, descending in (0, 1]
    latent_shape: tuple[int, int, int]  #: (C, h, w) of one frame's latent
    kv: KVGeometry  #: KV-cache geometry
    actions: ActionSpace  #: action space
    prompt_dim: int  #: prompt embedding length
    default_prompt: str  #: prompt used when a session gives none

    def __post_init__(self) -> None:
        if self.fps <= 0 or self.frames_per_chunk <= 0:
            raise ValueError("fps and frames_per_chunk must be positive")
        if not self.timesteps or any(not 0 < t <= 1 for t in self.timesteps):
            raise ValueError("timesteps must be non-empty, each in (0, 1]")
        if list(self.timesteps) != sorted(self.timesteps, reverse=True):
            raise ValueError("timesteps must be descending")

    @property
    def frame_period(self) -> Fraction:
        """Seconds between frames, exact."""
        return Fraction(1, self.fps)

    @property
    def denoising_steps(self) -> int:
        return len(self.timesteps)
