"""The contract between a world model and the engine: its declared geometry and per-session state.

A model declares everything the engine needs to plan memory and time up
front, in a `WorldModelSpec`: frame size and rate, how latent frames map to
pixel frames, the denoising timesteps, the action and prompt shapes, and
every kind of per-session state it needs (`StateSpec`s, each by name,
shape and dtype, in the spirit of vLLM's `KVCacheSpec` family:
`vllm/v1/kv_cache_interface.py`). The engine allocates all of a session's
state in one slot of a pool at admission, stages what a chunk changes and
commits or drops it as one transaction; the model holds none of it.

Kinds of state:
- `AttentionRingSpec`: a self-attention KV cache over latent frames, kept
  as `sink_frames` attention-sink frames (the session's first frames, kept
  forever; Xiao et al. 2023, StreamingLLM) plus a ring of the last
  `window_frames` committed frames (a rolling window; LongLive's
  `sink_size` / `local_attn_size`).
- `FrameRingSpec`: any other per-latent-frame tensor kept on the same
  sink + window positions (e.g. committed latents a prompt switch re-runs).
- `TensorStateSpec`: a fixed-size tensor replaced whole (a decoder's
  causal-conv cache, a previous latent, a cross-attention cache).
- `WorldMemorySpec`: world memory, what a session has shown anchored to
  world coordinates: a canvas that wraps, with a tag per cell saying which
  ground it holds, written in place a chunk's cells at a time
  (`models.base.MemoryWrite`); fixed size, so memory never grows with
  session age.

Conditioning (`ConditioningSpec`): which of a text prompt and a starting
image a model accepts or requires, with limits, and the named tensors its
`encode_conditioning` returns; a `ConditioningRequest` is what a user asked
for, passed to the model without being interpreted on the way. Actions
(`ActionSpace`): the named buttons and continuous axes (`Axis`), the mouse and
gamepad inputs bound to them, and the action layout clients build their inputs
from. Precision (`PrecisionSpec`): the compute dtypes a model can run
in and how close to its reference dtype its frames must stay; the engine
measures them at warm-up and serves the fastest one within that tolerance.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def ring_capacity(sink_frames: int, window_frames: int) -> int:
    """Frame positions of a sink + rolling-window ring."""
    return sink_frames + window_frames


def ring_position(frame: int, *, sink_frames: int, window_frames: int) -> int:
    """Position of absolute latent frame `frame` in a sink + rolling-window ring.

    Frames below `sink_frames` keep their own position forever; later frames
    cycle through the `window_frames` positions after them, each overwriting
    the frame `window_frames` older. Nothing moves on eviction, so a session
    runs indefinitely in fixed memory.
    """
    if frame < 0:
        raise ValueError(f"frame index {frame} must be >= 0")
    if frame < sink_frames:
        return frame
    return sink_frames + (frame - sink_frames) % window_frames


@dataclass(frozen=True)
class StateSpec:
    """One kind of per-session state, by name. Subclasses say which tensors it holds."""

    name: str  #: unique within the model
    #: the kind of state, for reports (`WorldModelSpec.state_bytes_by_kind`)
    kind = "state"

    def tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-session tensors: {tensor name: (shape, dtype)} (the pool adds a leading slot axis)."""
        raise NotImplementedError

    def bytes_per_session(self) -> int:
        """Bytes of all of one session's tensors of this state."""
        return sum(math.prod(shape) * _dtype_bytes(dt) for shape, dt in self.tensors().values())


@dataclass(frozen=True)
class AttentionRingSpec(StateSpec):
    """A self-attention KV cache over latent frames: sink frames plus a rolling window.

    Tensors (per session): "k", "v" float (layers, P * tokens_per_frame, heads, head_dim) in
    flash-attn's cache layout (tokens before heads; `flash_attn_with_kvcache`), and "frame"
    int64 (P,) the absolute latent frame held at each position (-1: empty); P = sink + window.

    Attention rule (see `kernels/attention.py`): a query of a chunk that starts at latent
    frame c0 sees every frame of its own chunk, committed frames c0 - window <= j < c0,
    and committed sink frames j < sink_frames.
    """

    kind = "attention_ring"
    layers: int = 1  #: transformer layers with a cache
    heads: int = 1  #: key/value heads per layer
    head_dim: int = 1  #: values per head
    tokens_per_frame: int = 1  #: key tokens per latent frame
    window_frames: int = 1  #: committed frames in the rolling window
    sink_frames: int = 0  #: attention-sink frames, kept forever
    dtype: torch.dtype = torch.float32  #: cache dtype (bfloat16 on a GPU)

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "head_dim", "tokens_per_frame", "window_frames"):
            if getattr(self, name) <= 0:
                raise ValueError(f"AttentionRingSpec.{name} must be positive")
        if self.sink_frames < 0:
            raise ValueError("AttentionRingSpec.sink_frames must be >= 0")

    @property
    def capacity_frames(self) -> int:
        """Frame positions: sink plus window."""
        return ring_capacity(self.sink_frames, self.window_frames)

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_frames * self.tokens_per_frame

    def position(self, frame: int) -> int:
        """Ring position of absolute latent frame `frame`."""
        return ring_position(frame, sink_frames=self.sink_frames, window_frames=self.window_frames)

    def tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        kv = (self.layers, self.capacity_tokens, self.heads, self.head_dim)
        return {"k": (kv, self.dtype), "v": (kv, self.dtype), "frame": ((self.capacity_frames,), torch.int64)}


@dataclass(frozen=True)
class FrameRingSpec(StateSpec):
    """A per-latent-frame tensor on sink + rolling-window positions (same rule as `AttentionRingSpec`).

    Tensors: "data" (P, *frame_shape), "frame" int64 (P,) (-1: empty).
    """

    kind = "frame_ring"
    frame_shape: tuple[int, ...] = ()  #: shape of one frame's entry
    window_frames: int = 1  #: committed frames in the rolling window
    sink_frames: int = 0  #: frames kept forever
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.window_frames <= 0 or self.sink_frames < 0:
            raise ValueError("FrameRingSpec needs window_frames > 0 and sink_frames >= 0")

    @property
    def capacity_frames(self) -> int:
        return ring_capacity(self.sink_frames, self.window_frames)

    def position(self, frame: int) -> int:
        return ring_position(frame, sink_frames=self.sink_frames, window_frames=self.window_frames)

    def tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"data": ((self.capacity_frames, *self.frame_shape), self.dtype),
                "frame": ((self.capacity_frames,), torch.int64)}


@dataclass(frozen=True)
class TensorStateSpec(StateSpec):
    """A fixed-size tensor replaced whole by an update (decoder cache, last latent, ...).

    Tensors: "data" (*shape).
    """

    kind = "tensor"
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32

    def tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"data": (self.shape, self.dtype)}


@dataclass(frozen=True)
class WorldMemorySpec(StateSpec):
    """World memory: what a session has shown, anchored to world coordinates, in a fixed-size canvas that wraps.

    A world position (X, Y) (pixels, any integers: a session walks forever) lives in cell
    (Y mod side, X mod side); the cell's tag says which ground it holds (the model's own code of the
    position's wrap and its world, 0: nothing), so a position is remembered iff its cell's tag is
    that position's code. A position is forgotten only when a view covers a position `side` px
    from it on an axis, so a walk that keeps within `reach_px` of a place in every direction
    forgets nothing it showed there (the model sets side >= view + 2 reach_px); farther, the
    oldest ground is overwritten by the newest.
    The pool counts its bytes like any state, admission charges them, snapshots and moves carry
    them byte for byte (`engine/session_state.py`), and replay regenerates them.

    Writes are in place (`models.base.MemoryWrite`: a chunk's cells, their values and tags), at
    commit like every update; reads index the pool's own tensors (`models.base.StateView.memory`).

    Tensors (per session): "canvas" uint8 (side, side, channels), "tag" int32 (side, side).

    Raises:
        ValueError: a side not above 2 * reach_px, or no channels.
    """

    kind = "world_memory"
    side: int = 1  #: canvas side, cells (one cell a world pixel)
    channels: int = 3  #: values per cell (RGB)
    reach_px: int = 0  #: ground within this many pixels of the view, in every direction, is always held

    def __post_init__(self) -> None:
        if self.channels <= 0 or self.reach_px < 0 or self.side <= 2 * self.reach_px:
            raise ValueError(f"WorldMemorySpec {self.name!r}: side {self.side} must exceed 2 * reach_px "
                             f"({self.reach_px}) and channels ({self.channels}) be positive")

    def tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"canvas": ((self.side, self.side, self.channels), torch.uint8),
                "tag": ((self.side, self.side), torch.int32)}


@dataclass(frozen=True)
class PromptCacheSpec(TensorStateSpec):
    """A cross-attention cache computed from the conditioning: replaced (re-cached) on every change of it."""

    kind = "prompt_cache"


#: How an axis's wire values accumulate between frames (`Axis.kind`).
AXIS_KINDS = ("relative", "absolute")
#: Most messages whose movement a relative axis without a clip may sum into one pixel frame (`Axis.extent`).
RELATIVE_SUM_BOUND = 10_000
#: Device inputs a client may bind to a model's controls (`ActionSpace.bindings`): the mouse's two axes (relative
#: counts) and the W3C Gamepad API's standard mapping (https://w3c.github.io/gamepad/#remapping): axes 0-3 are the
#: left stick x, y and the right stick x, y in [-1, 1] (y down), buttons 0-16 pressed or, for the triggers 6 and 7,
#: analog in [0, 1]. Keyboard keys need no binding: a key is bound by its name.
_INPUT = re.compile(r"^(mouse\.[xy]|gamepad\.axis\.([0-9]|1[0-5])|gamepad\.button\.([0-9]|1[0-9]|2[0-3]))$")


@dataclass(frozen=True)
class Axis:
    """One named continuous control of a model's action space.

    A message's value for an axis is in wire units; the model sees model units (value x `scale`, then clipped to
    +-`limit`), one value per pixel frame (`ActionSpace.axis_values`):

    - ``"relative"`` (a mouse, a scroll wheel): the value is movement since the client's previous message; messages
      add up until a chunk samples them, and the sum is spread evenly over the chunk's pixel frames. A lost message
      loses only its own movement.
    - ``"absolute"`` (a stick, a trigger, a camera pose): the value is the position now, state like a held key: the
      newest message wins, an older reordered one is ignored, and an axis a message leaves out is at `rest`.

    Raises:
        ValueError: an empty name, an unknown kind, an empty or non-finite range, a non-finite scale, a limit that is
            not positive, or a rest position outside the range.
    """

    name: str  #: what it does, e.g. "yaw" (turn) or "pitch" (look up/down)
    kind: str = "relative"  #: "relative" or "absolute" (`AXIS_KINDS`)
    range: tuple[float, float] = (-10_000.0, 10_000.0)  #: wire values a message may carry, inclusive
    scale: float = 1.0  #: model units per wire unit
    limit: float | None = None  #: |model value| per pixel frame is clipped to this (None: no clip)
    rest: float = 0.0  #: absolute: the position when no message gave one, wire units
    label: str = ""  #: what it does, for user interfaces ("" : the name)

    def __post_init__(self) -> None:
        lo, hi = self.range
        if not self.name or len(self.name) > 64:
            raise ValueError("Axis.name must have 1 to 64 characters")
        if self.kind not in AXIS_KINDS:
            raise ValueError(f"Axis.kind must be one of {AXIS_KINDS}, got {self.kind!r}")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"Axis {self.name!r}: range must be finite with low < high, got {self.range}")
        if not math.isfinite(self.scale) or (self.limit is not None and not self.limit > 0):
            raise ValueError(f"Axis {self.name!r}: scale must be finite and limit positive")
        if not lo <= self.rest <= hi:
            raise ValueError(f"Axis {self.name!r}: rest {self.rest} lies outside its range {self.range}")

    def model_value(self, wire: float) -> float:
        """A per-pixel-frame wire value in model units: x `scale`, clipped to +-`limit`."""
        v = wire * self.scale
        return v if self.limit is None else min(max(v, -self.limit), self.limit)

    def extent(self) -> tuple[float, float]:
        """The least and greatest model value one pixel frame of this axis can carry.

        An absolute axis: its range's ends in model units. A relative axis: its clip (`limit`), or, without one,
        the movement of `RELATIVE_SUM_BOUND` messages at the range's ends spread over one frame (movements add up
        between chunks; an input gate admits far fewer messages a chunk).
        """
        if self.kind == "absolute":
            a, b = self.model_value(self.range[0]), self.model_value(self.range[1])
        elif self.limit is not None:
            a, b = -self.limit, self.limit
        else:
            a, b = (self.range[0] * self.scale * RELATIVE_SUM_BOUND, self.range[1] * self.scale * RELATIVE_SUM_BOUND)
        return min(a, b), max(a, b)


@dataclass(frozen=True)
class ActionSpace:
    """The named buttons and continuous axes a model understands, how clients may drive them, and the layout of its
    action vectors.

    Clients build their inputs from this (`GET /v1/model`). An action message carries `keys` (the buttons held
    now, by name from `keys`), `axes` ({axis name: value}, see `Axis` for relative and absolute axes), and, for
    keyboard-and-mouse clients, `mouse: [dx, dy]` counts, which feed the axes bound to "mouse.x" and "mouse.y"
    (`bindings`; a model with neither ignores the movement). `WorldModel.encode_action` turns one pixel frame's
    held buttons and axis values (model units, `axis_values`) into a float32 vector of length `dim`;
    `WorldModel.group_actions` groups a chunk's per-pixel-frame vectors per latent frame. A model that attends over
    actions of earlier chunks (`history_pixel_frames`) keeps them in its own declared state.

    Raises:
        ValueError: duplicate names, a label, group or binding naming an unknown control, a binding from an unknown
            device input or of the wrong kind (mouse inputs feed relative axes; gamepad axes feed absolute axes;
            gamepad buttons feed buttons or absolute axes), or an input bound twice.
    """

    keys: tuple[str, ...]  #: button names (keyboard keys by their name), e.g. ("w", "a", "s", "d", "space")
    axes: tuple[Axis, ...] = ()  #: continuous controls
    dim: int = 8  #: length of `encode_action`'s vector per pixel frame
    key_labels: tuple[tuple[str, str], ...] = ()  #: (key, what it does), for user interfaces
    exclusive_groups: tuple[tuple[str, ...], ...] = ()  #: keys of which at most one is applied at a time
    history_pixel_frames: int = 0  #: pixel frames of earlier chunks each chunk's actions reach back over
    #: (device input, control): which mouse or gamepad input drives which button or axis (see `_INPUT`)
    bindings: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"ActionSpace.keys must be unique: {self.keys}")
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names) or set(names) & set(self.keys):
            raise ValueError(f"ActionSpace axis names must be unique and differ from the keys: {names}")
        if self.dim <= 0 or self.history_pixel_frames < 0:
            raise ValueError("ActionSpace.dim must be positive and history_pixel_frames >= 0")
        for key, _ in self.key_labels:
            if key not in self.keys:
                raise ValueError(f"ActionSpace.key_labels names unknown key {key!r}")
        for group in self.exclusive_groups:
            if any(k not in self.keys for k in group):
                raise ValueError(f"ActionSpace.exclusive_groups names unknown keys: {group}")
        inputs = [i for i, _ in self.bindings]
        if len(set(inputs)) != len(inputs):
            raise ValueError(f"ActionSpace.bindings binds an input twice: {inputs}")
        axes = {a.name: a for a in self.axes}
        for inp, control in self.bindings:
            if not _INPUT.match(inp):
                raise ValueError(f"ActionSpace.bindings: unknown device input {inp!r} (mouse.x, mouse.y, "
                                 "gamepad.axis.N, gamepad.button.N)")
            ax = axes.get(control)
            if ax is None and control not in self.keys:
                raise ValueError(f"ActionSpace.bindings binds {inp!r} to unknown control {control!r}")
            if inp.startswith("mouse.") and (ax is None or ax.kind != "relative"):
                raise ValueError(f"ActionSpace.bindings: {inp!r} moves; it can feed only a relative axis")
            if inp.startswith("gamepad.axis.") and (ax is None or ax.kind != "absolute"):
                raise ValueError(f"ActionSpace.bindings: {inp!r} is a position; it can feed only an absolute axis")
            if inp.startswith("gamepad.button.") and ax is not None and ax.kind != "absolute":
                raise ValueError(f"ActionSpace.bindings: {inp!r} is a button; it can feed a key or an absolute axis")

    def label(self, key: str) -> str:
        """What `key` does (its label, else its name)."""
        return dict(self.key_labels).get(key, key)

    def axis(self, name: str) -> Axis:
        """The axis called `name` (KeyError: none)."""
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def mouse(self) -> tuple[Axis | None, Axis | None]:
        """The axes the wire's `mouse: [dx, dy]` feeds: those bound to "mouse.x" and "mouse.y" (None: unbound)."""
        bound = dict(self.bindings)
        return tuple(None if bound.get(i) is None else self.axis(bound[i])  # type: ignore[return-value]
                     for i in ("mouse.x", "mouse.y"))

    def rest_positions(self) -> dict[str, float]:
        """Every absolute axis at its rest position, wire units."""
        return {a.name: a.rest for a in self.axes if a.kind == "absolute"}

    def axis_values(self, moves: dict[str, float], positions: dict[str, float], frames: int) -> dict[str, float]:
        """Each axis's value for every one of `frames` pixel frames, model units (what `encode_action` is given).

        Args:
            moves: summed movement of relative axes since the last chunk, wire units (absent: none); spread evenly
                over the frames.
            positions: positions of absolute axes, wire units (absent: at rest).
            frames: pixel frames the chunk has, >= 1.
        """
        out = {}
        for a in self.axes:
            wire = moves.get(a.name, 0.0) / frames if a.kind == "relative" else positions.get(a.name, a.rest)
            out[a.name] = a.model_value(wire)
        return out


# -- conditioning -------------------------------------------------------------------------------

#: Image file formats a session may start from (Pillow's format names, lower case).
IMAGE_FORMATS = ("png", "jpeg")


@dataclass(frozen=True)
class TextConditioning:
    """A model takes a text prompt."""

    max_chars: int = 500  #: longest prompt, characters
    required: bool = False  #: False: `WorldModelSpec.default_prompt` is used when a session gives none

    def __post_init__(self) -> None:
        if self.max_chars <= 0:
            raise ValueError("TextConditioning.max_chars must be positive")


@dataclass(frozen=True)
class ImageConditioning:
    """A model takes a starting image (the first frame of an image-to-video world model)."""

    required: bool = True  #: a session must give one unless `default` says what is used instead
    default: str | None = None  #: what the model starts from when no image is given (None: such a session is refused)
    max_bytes: int = 8 * 2**20  #: largest encoded image file, bytes
    max_pixels: int = 4096 * 4096  #: largest width x height of the decoded image, pixels
    formats: tuple[str, ...] = IMAGE_FORMATS  #: accepted file formats

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_pixels <= 0:
            raise ValueError("ImageConditioning limits must be positive")
        if any(f not in IMAGE_FORMATS for f in self.formats):
            raise ValueError(f"ImageConditioning.formats must be among {IMAGE_FORMATS}")


@dataclass(frozen=True)
class ConditioningSpec:
    """What a model is conditioned on, and the shapes of its encoded conditioning.

    `tensors` are what `WorldModel.encode_conditioning` returns, by name; the
    engine stacks them per batch, (B, *shape), without knowing what they mean.
    """

    text: TextConditioning | None = TextConditioning()  #: None: the model takes no text prompt
    image: ImageConditioning | None = None  #: None: the model takes no starting image
    tensors: tuple[tuple[str, tuple[int, ...], torch.dtype], ...] = ()  #: (name, shape, dtype) of each encoded part

    def __post_init__(self) -> None:
        names = [n for n, _, _ in self.tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"ConditioningSpec.tensors names must be unique: {names}")

    def tensor_specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {n: (shape, dt) for n, shape, dt in self.tensors}

    def validate(self, request: ConditioningRequest) -> None:
        """Check a request against what the model accepts (before anything is allocated).

        Raises:
            ConditioningError: it gives what the model does not take, or lacks what it needs;
                the error names the field ("prompt", "image") and the reason.
        """
        from worldcast.models.errors import ConditioningError

        if request.text is not None:
            if self.text is None:
                raise ConditioningError("prompt", "this model takes no text prompt (it is conditioned on an image)")
            if len(request.text) > self.text.max_chars:
                raise ConditioningError("prompt", f"longer than {self.text.max_chars} characters")
        elif self.text is not None and self.text.required:
            raise ConditioningError("prompt", "this model needs a prompt")
        if request.image is not None:
            if self.image is None:
                raise ConditioningError("image", "this model takes no image")
            im = request.image
            if im.dtype != np.uint8 or im.ndim != 3 or im.shape[2] != 3 or im.shape[0] < 1 or im.shape[1] < 1:
                raise ConditioningError("image", f"must be uint8 (H, W, 3) RGB, got {im.dtype} {tuple(im.shape)}")
            if im.shape[0] * im.shape[1] > self.image.max_pixels:
                raise ConditioningError("image", f"{im.shape[1]}x{im.shape[0]} is over {self.image.max_pixels} pixels")
        elif self.image is not None and self.image.required and self.image.default is None:
            raise ConditioningError("image", "this model needs a starting image (PNG or JPEG)")

    def check_encoded(self, encoded: Conditioning) -> None:
        """Check an encoding against the declared `tensors` (a model bug otherwise).

        Raises:
            ValueError: a missing, unexpected or misshapen part.
        """
        want = self.tensor_specs()
        if set(encoded) != set(want):
            raise ValueError(f"encoded conditioning has parts {sorted(encoded)}, the spec declares {sorted(want)}")
        for name, (shape, _) in want.items():
            if tuple(encoded[name].shape) != tuple(shape):
                raise ValueError(f"encoded conditioning {name!r} has shape {tuple(encoded[name].shape)}, "
                                 f"the spec declares {tuple(shape)}")


@dataclass(frozen=True)
class PrecisionSpec:
    """The compute precisions a model can run in, and how close to the reference its frames must stay.

    `dtypes[0]` is the reference (float32 for the models here). At warm-up the
    engine runs `check_chunks` chunks of one session from the same initial
    state, noise and actions in the reference and in each other dtype, and a
    dtype qualifies only if the PSNR of its decoded frames against the
    reference's frames (uint8, peak 255; the measure of `models/tinyworld/evaluate.py`)
    is at least `min_psnr_db` for every frame. Among qualified dtypes the
    fastest measured chunk is served (`engine/tuning/precision.py`). A model whose
    state's dtypes follow its precision says so in its `spec.states` after
    `WorldModel.set_precision`.
    """

    dtypes: tuple[torch.dtype, ...] = (torch.float32,)  #: supported compute dtypes, the reference first
    min_psnr_db: float = 40.0  #: least PSNR of a frame against the reference's frame, dB
    check_chunks: int = 4  #: chunks of the quality check (errors feed back through the state)

    def __post_init__(self) -> None:
        if not self.dtypes or len(set(self.dtypes)) != len(self.dtypes):
            raise ValueError("PrecisionSpec.dtypes must be non-empty and unique")
        if any(not dt.is_floating_point for dt in self.dtypes):
            raise ValueError(f"PrecisionSpec.dtypes must be floating-point dtypes, got {self.dtypes}")
        if not self.min_psnr_db > 0 or self.check_chunks < 1:
            raise ValueError("PrecisionSpec needs min_psnr_db > 0 and check_chunks >= 1")

    @property
    def reference(self) -> torch.dtype:
        """The dtype every other one is checked against."""
        return self.dtypes[0]


def dtype_name(dtype: torch.dtype) -> str:
    """"float32", "bfloat16", ... (torch's name without the module prefix)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype called `name` ("float32", "bfloat16", "float16", "float64").

    Raises:
        ValueError: not a floating-point dtype name.
    """
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"{name!r} is not a floating-point dtype (float32, bfloat16, float16, float64)")
    return dt


#: Longest prompt a session takes, characters (every transport refuses a longer one; so does replay).
MAX_PROMPT_CHARS = 500


@dataclass(frozen=True, eq=False)
class ConditioningRequest:
    """What a user asked a session to be conditioned on; never interpreted outside its model.

    Attributes:
        text: the prompt (None: none given).
        image: uint8 (H, W, 3) RGB decoded starting image of any size (None: none given);
            the model resizes or crops it to its geometry.
    """

    text: str | None = None
    image: np.ndarray | None = None

    def with_text(self, text: str) -> ConditioningRequest:
        """The same request with a new prompt (the image kept)."""
        return ConditioningRequest(text=text, image=self.image)


#: An encoded conditioning, {part name: array} with the shapes of `ConditioningSpec.tensors`.
Conditioning = dict[str, np.ndarray]


@dataclass(frozen=True)
class WorldModelSpec:
    """Geometry of a causal video world model, declared up front.

    A chunk is `latent_frames_per_chunk` latent frames denoised together over
    `timesteps` (descending flow times; one denoising step each), then
    committed to the session's state by a pass at `commit_timestep` (the
    "context noise"; 0 = clean). Latent frame i decodes to
    `first_latent_pixel_frames` pixel frames if i == 0, else
    `pixel_frames_per_latent` (the causal Wan VAE: 1, then 4). A session's
    `init` step commits its first `initial_latent_frames` latent frames from
    an initial picture (0: the first chunk starts from noise).
    """

    name: str  #: model family and size, e.g. "tinyworld-w192l5"
    frame_height: int  #: pixels
    frame_width: int  #: pixels
    fps: int  #: pixel frames per second of generated video (Hz)
    latent_frames_per_chunk: int  #: latent frames generated together
    timesteps: tuple[float, ...]  #: flow times of the denoising steps, descending in (0, 1]
    latent_shape: tuple[int, int, int]  #: (C, h, w) of one latent frame
    states: tuple[StateSpec, ...]  #: every kind of per-session state, by name
    actions: ActionSpace  #: action space
    conditioning: ConditioningSpec  #: what the model is conditioned on (text, image) and its encoded shapes
    default_prompt: str = ""  #: prompt used when a session gives none (models that take text)
    pixel_frames_per_latent: int = 1  #: pixel frames each latent frame decodes to (after the first)
    first_latent_pixel_frames: int = 1  #: pixel frames latent frame 0 decodes to
    initial_latent_frames: int = 1  #: latent frames the init step commits from an initial picture
    commit_timestep: float = 0.0  #: flow time of the pass that writes a finished chunk's state
    #: the encoded conditioning is part of every chunk's input (False: only `init_state` and `set_prompt` read
    #: it; the model keeps what it derives, e.g. a cross-attention cache, in declared state)
    context_in_chunks: bool = True
    precisions: PrecisionSpec = PrecisionSpec()  #: compute dtypes it can run in, and their tolerance

    def __post_init__(self) -> None:
        if self.fps <= 0 or self.latent_frames_per_chunk <= 0:
            raise ValueError("fps and latent_frames_per_chunk must be positive")
        if self.pixel_frames_per_latent <= 0 or self.first_latent_pixel_frames <= 0:
            raise ValueError("pixel frames per latent frame must be positive")
        if self.initial_latent_frames < 0:
            raise ValueError("initial_latent_frames must be >= 0")
        if not self.timesteps or any(not 0 < t <= 1 for t in self.timesteps):
            raise ValueError("timesteps must be non-empty, each in (0, 1]")
        if list(self.timesteps) != sorted(self.timesteps, reverse=True):
            raise ValueError("timesteps must be descending")
        if not 0 <= self.commit_timestep < self.timesteps[-1]:
            raise ValueError("commit_timestep must lie in [0, last timestep)")
        names = [s.name for s in self.states]
        if len(set(names)) != len(names):
            raise ValueError(f"state names must be unique: {names}")
        if self.conditioning.text is not None and not self.default_prompt and not self.conditioning.text.required:
            raise ValueError("a model that takes an optional text prompt declares a default_prompt")

    # -- time ----------------------------------------------------------------------------

    @property
    def frame_period(self) -> Fraction:
        """Seconds between pixel frames, exact."""
        return Fraction(1, self.fps)

    @property
    def denoising_steps(self) -> int:
        return len(self.timesteps)

    def pixel_start(self, latent: int) -> int:
        """Index of the first pixel frame latent frame `latent` decodes to."""
        if latent <= 0:
            return 0
        return self.first_latent_pixel_frames + (latent - 1) * self.pixel_frames_per_latent

    def pixel_count(self, latent: int) -> int:
        """Pixel frames latent frame `latent` decodes to."""
        return self.first_latent_pixel_frames if latent == 0 else self.pixel_frames_per_latent

    def chunk_pixel_frames(self, first_latent: int) -> int:
        """Pixel frames of the chunk whose first latent frame is `first_latent`."""
        return self.pixel_start(first_latent + self.latent_frames_per_chunk) - self.pixel_start(first_latent)

    @property
    def frames_per_chunk(self) -> int:
        """Pixel frames of a chunk after the first (the steady-state chunk)."""
        return self.latent_frames_per_chunk * self.pixel_frames_per_latent

    @property
    def chunk_period(self) -> Fraction:
        """Seconds of video one steady-state chunk covers, exact."""
        return self.frames_per_chunk * self.frame_period

    # -- state -----------------------------------------------------------------------------

    def state(self, name: str) -> StateSpec:
        """The declared state called `name`.

        Raises:
            KeyError: the model declares no such state.
        """
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(f"{self.name} declares no state {name!r}; it has {[s.name for s in self.states]}")

    def state_bytes_per_session(self) -> int:
        """Bytes of all of one session's declared state (what admission charges)."""
        return sum(s.bytes_per_session() for s in self.states)

    def state_bytes_by_kind(self) -> dict[str, int]:
        """Bytes of one session's declared state per kind ("attention_ring", "frame_ring", "prompt_cache",
        "tensor", "world_memory"), for start-up logs and reports."""
        out: dict[str, int] = {}
        for s in self.states:
            out[s.kind] = out.get(s.kind, 0) + s.bytes_per_session()
        return out
