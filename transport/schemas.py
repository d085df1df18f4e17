"""Wire schemas (pydantic): HTTP bodies, data-channel messages, RPCs.

Field names here are the protocol; `web_demo/` uses them unchanged.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from worldcast.models.spec import MAX_PROMPT_CHARS  # noqa: F401 - re-exported: the transports' prompt limit

#: Largest SDP offer, characters.
MAX_SDP_CHARS = 64_000
#: Largest action message on a data channel, bytes.
MAX_MESSAGE_BYTES = 2048
#: Largest control message, bytes (room for a MAX_PROMPT_CHARS prompt of 4-byte characters).
MAX_CONTROL_BYTES = 4096
#: Largest starting image any model may accept, bytes (a model's own `ImageConditioning.max_bytes` is at most this).
MAX_IMAGE_BYTES = 32 * 2**20
#: LiveKit room names accepted: letters, digits and _ . : - (LiveKit allows more; these need no escaping).
ROOM_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def check_prompt(v: str | None) -> str | None:
    """The one prompt rule of every surface (HTTP, RPCs on every transport, directions, Dreamverse,
    LiveKit dispatch metadata): returns the prompt as it is used.

    - control characters (Unicode category Cc, surrogates Cs) and the bidirectional embedding,
      override and isolate controls (`BIDI_CONTROLS`, which can disguise text; Unicode TR9) are refused;
    - every other format character (category Cf: zero-width space U+200B, joiners U+200C/U+200D,
      the byte order mark U+FEFF, the marks U+200E/U+200F, soft hyphen U+00AD, tag characters
      U+E0000-U+E007F, ...) is removed: invisible, it can only hide text from whoever reads the prompt;
    - the rest is NFC-normalised (Unicode TR15) and stripped of surrounding whitespace;
    - a prompt with no visible character left (a letter, digit, punctuation or symbol other than the
      blank fillers in `INVISIBLE_LETTERS`) is refused.

    Raises:
        ValueError: a refused character (named by code point) or no visible text.
    """
    if v is None:
        return v
    bad = [c for c in v if unicodedata.category(c) in ("Cc", "Cs") or c in BIDI_CONTROLS]
    if bad:
        raise ValueError(f"prompt contains control character U+{ord(bad[0]):04X}")
    text = unicodedata.normalize("NFC", "".join(c for c in v if unicodedata.category(c) != "Cf")).strip()
    if not any(unicodedata.category(c)[0] in "LNPS" and c not in INVISIBLE_LETTERS for c in text):
        raise ValueError("prompt is blank (no visible character)" if not v.strip() else
                         "prompt has no visible character (only spaces, marks or invisible format characters)")
    return text


#: Unicode bidirectional formatting characters (can disguise text; Unicode TR9).
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: Characters of visible categories that render as nothing (Hangul fillers, the blank Braille pattern).
INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


class CreateSessionRequest(_Strict):
    """Body of POST /v1/sessions (all optional)."""

    prompt: str | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS, description="initial prompt")
    seed: StrictInt | None = Field(None, ge=0, le=2**31 - 1, description="seed of the initial world and noise")
    stamp_frames: StrictBool = Field(
        False, description="stamp each video frame's index and applied action seq into its bottom rows "
        "(for latency measurement; see transport/media/stamp.py)")
    image: str | None = Field(
        None, min_length=1, max_length=4 * (MAX_IMAGE_BYTES // 3 + 1) + 64,
        description="starting image for a model that takes one (GET /v1/model: conditioning.image): a PNG or JPEG "
        "file as base64 (RFC 4648), bare or as a data:image/...;base64, URL; or send it as the `image` file part "
        "of a multipart/form-data body")
    record: StrictBool = Field(
        False, description="record the session from its first frame: an event log (every action, prompt, flush, "
        "chunk and frame) that `worldcast replay` generates again frame for frame; GET "
        "/v1/sessions/{id}/recording/events (see docs/recordings.md)")
    snapshot: str | None = Field(
        None, pattern=r"^[0-9a-f]{1,64}$", description="start from this snapshot (POST /v1/sessions/{id}/snapshots): "
        "its world, prompt, image and seed; send the token of the session that took it as 'Authorization: Bearer "
        "<token>' (see docs/recordings.md). Not with prompt, image, seed or mode")
    mode: Literal["interactive", "directing"] = Field(
        "interactive", description="directing: driven by text directions, segment by segment, over "
        "GET /v1/sessions/{id}/stream (see docs/streaming.md)")

    transport: Literal["webrtc", "livekit"] = Field(
        "webrtc", description="webrtc: negotiate with POST /v1/sessions/{id}/webrtc; livekit: the server joins "
        "`room` as the session's world and the reply carries the user's LiveKit token")
    room: str | None = Field(None, pattern=ROOM_PATTERN, description="LiveKit room (transport livekit only); "
                             "omitted: the server names a fresh one. A named room must be new: one that another "
                             "session holds or that exists on the LiveKit server is a 409 unless the request "
                             "carries the admin token")

    _prompt = field_validator("prompt")(check_prompt)

    @model_validator(mode="after")
    def _room_with_livekit(self) -> CreateSessionRequest:
        if self.transport != "livekit" and self.room is not None:
            raise ValueError("room is only for transport 'livekit'")
        if self.snapshot is not None:
            given = [k for k in ("prompt", "image", "seed") if getattr(self, k) is not None]
            if self.mode != "interactive":
                given.append("mode")
            if given:
                raise ValueError(f"a session from a snapshot takes its world from it: drop {', '.join(given)}")
        return self


class LiveKitAccess(BaseModel):
    """How the user joins a LiveKit session (part of the create reply)."""

    url: str = Field(description="LiveKit server URL (ws:// or wss://)")
    room: str
    identity: str = Field(description="the user's participant identity (the token's)")
    token: str = Field(description="access token: join this room, subscribe, publish data only")
    token_ttl_s: float = Field(description="the token is valid for joining this long, s")
    world_identity: str = Field(description="the world participant: its video track, RPC methods and data topics")


class MouseAxisInfo(BaseModel):
    name: str = Field(description="what the axis does, e.g. yaw")
    scale: float = Field(description="model units per mouse count")
    limit: float | None = Field(None, description="per-pixel-frame clip of the axis, model units (null: none)")


class AxisInfo(BaseModel):
    """One continuous control (`models/spec.py` `Axis`)."""

    name: str
    label: str = Field(description="what it does")
    kind: Literal["relative", "absolute"] = Field(
        description="relative: an action's value is movement since the previous message, summed until a chunk "
        "samples it; absolute: the position now (newest message wins; left out: at rest)")
    range: tuple[float, float] = Field(description="values an action message may carry, inclusive")
    rest: float = Field(description="absolute: the position when none is given")
    scale: float = Field(description="model units per wire unit")
    limit: float | None = Field(None, description="per-pixel-frame clip, model units (null: none)")


class ActionSpaceInfo(BaseModel):
    """The actions a model understands; clients build their inputs from it."""

    keys: list[str] = Field(description="key names an action message may hold")
    key_labels: dict[str, str] = Field(description="what each key does")
    mouse: list[MouseAxisInfo] = Field(description="axes fed by an action's mouse [dx, dy] in order (those bound "
                                       "to mouse.x, mouse.y); empty: the model ignores the mouse")
    axes: list[AxisInfo] = Field(default_factory=list, description="continuous controls an action's `axes` may set")
    bindings: dict[str, str] = Field(
        default_factory=dict, description="device input -> the key or axis it drives: mouse.x, mouse.y, "
        "gamepad.axis.N, gamepad.button.N (the W3C Gamepad API's standard mapping); keyboard keys by their name")
    exclusive_groups: list[list[str]] = Field(description="keys of which at most one is applied at a time")
    dim: int = Field(description="length of the model's action vector per pixel frame")
    history_pixel_frames: int = Field(description="pixel frames of earlier chunks each chunk's actions reach back over")


class TextConditioningInfo(BaseModel):
    max_chars: int
    required: bool = Field(description="false: the default prompt is used when none is given")


class ImageConditioningInfo(BaseModel):
    required: bool
    default: str | None = Field(description="what the model starts from without an image (null: refused)")
    max_bytes: int
    max_pixels: int
    formats: list[str]


class ConditioningInfo(BaseModel):
    """What a model is conditioned on (null: not taken)."""

    text: TextConditioningInfo | None
    image: ImageConditioningInfo | None


class ModelInfo(BaseModel):
    """The served model's declared geometry, conditioning and actions."""

    name: str
    frame_width: int
    frame_height: int
    fps: int
    frames_per_chunk: int = Field(description="pixel frames of a chunk after the first")
    denoising_steps: int
    keys: list[str] = Field(description="the action space's keys (also in actions.keys)")
    default_prompt: str | None = Field(description="the prompt of a session that gives none (null: the model takes "
                                       "no text)")
    actions: ActionSpaceInfo
    conditioning: ConditioningInfo
    latent_frames_per_chunk: int = Field(description="latent frames denoised together")
    pixel_frames_per_latent: int = Field(description="pixel frames each latent frame decodes to (after the first)")
    first_chunk_frames: int = Field(description="pixel frames of a session's first chunk")
    state_bytes_per_session: int = Field(description="bytes of one session's declared state (KV, caches)")


class ModelOptionInfo(BaseModel):
    name: str = Field(description="the command-line flag, without the dashes")
    help: str
    default: Any = None
    choices: list[str] | None = None


class ModelVariantInfo(BaseModel):
    name: str
    description: str
    needs_weights: bool
    random_weights: bool
    frame_width: int = Field(description="pixels (0: set by an option or the weights)")
    frame_height: int
    fps: int
    conditioning: ConditioningInfo
    actions: ActionSpaceInfo | None


class ModelFamilyInfo(BaseModel):
    """One registered model family (`--model NAME[:VARIANT]`)."""

    name: str
    description: str
    default_variant: str
    variants: list[ModelVariantInfo]
    options: list[ModelOptionInfo]
    served: str | None = Field(description="the variant this server runs, if it is of this family")


class CreateSessionResponse(BaseModel):
    session_id: str
    token: str = Field(description="send as 'Authorization: Bearer <token>' on this session's routes")
    model: ModelInfo
    livekit: LiveKitAccess | None = Field(None, description="transport livekit: how the user joins")


class SdpOffer(_Strict):
    """Body of POST /v1/sessions/{id}/webrtc."""

    sdp: str = Field(min_length=1, max_length=MAX_SDP_CHARS)
    type: Literal["offer"]


class SdpAnswer(BaseModel):
    sdp: str
    type: Literal["answer"] = "answer"


class ActionMessage(_Strict):
    """One message on the `actions` data channel.

    Example: {"seq": 42, "t": 1234.5, "keys": ["w", "shift"], "mouse": [3, -1]}, or with a gamepad
    {"seq": 43, "t": 1250.0, "keys": [], "axes": {"move_x": 0.8, "look_y": -0.25}}
    """

    seq: StrictInt = Field(ge=0, le=2**53, description="increasing per message")
    t: StrictFloat | StrictInt = Field(ge=0, allow_inf_nan=False, description="client send time, ms (any origin)")
    keys: list[str] = Field(default_factory=list, max_length=16, description="keys held now")
    mouse: tuple[StrictFloat | StrictInt, StrictFloat | StrictInt] = Field(  # NaN/inf: rejected by ActionGate
        (0, 0), description="mouse movement since the previous message, counts (dx, dy)"
    )
    axes: dict[Annotated[str, Field(min_length=1, max_length=64)], StrictFloat | StrictInt] = Field(
        default_factory=dict, max_length=32, description="the model's axes (GET /v1/model: actions.axes) by name: "
        "movement since the previous message for a relative axis, the position now for an absolute one (left out: "
        "at rest); range-checked by ActionGate")


class RpcRequest(_Strict):
    """A control RPC: on the `control` data channel or POST /v1/sessions/{id}/rpc.

    JSON-RPC 2.0 framing (section 4) is accepted: `"jsonrpc": "2.0"` is echoed in the reply, and
    a 2.0 request without an `id` member is a notification (run, never answered).
    """

    jsonrpc: Literal["2.0"] | None = Field(None, description='"2.0" for JSON-RPC 2.0 framing; echoed')
    id: Annotated[StrictInt, Field(ge=-(2**53), le=2**53)] | Annotated[str, Field(max_length=64)] | None = Field(
        None, description="echoed in the reply: an integer within +-2**53 or a string of at most 64 characters")
    method: str = Field(min_length=1, max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)


class SetPromptParams(_Strict):
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)

    _prompt = field_validator("prompt")(check_prompt)


class NoParams(_Strict):
    pass


#: Longest direction id, characters.
MAX_DIRECTION_ID_CHARS = 128
#: Longest segment a direction may ask for, s.
MAX_SEGMENT_S = 600.0


class DirectionMessage(_Strict):
    """A text direction on a directing session's stream (GET /v1/sessions/{id}/stream).

    Example: {"type": "direction", "id": "d7", "prompt": "a snowy field", "duration_s": 5}.
    `duration_s` absent: the server's default segment length; null: until the next direction.
    `from_segment` N: take segment N again: the world is put back where it began, and this direction's segment
    starts from there (`sessions/takes.py`).
    """

    type: Literal["direction"]
    id: str | StrictInt = Field(description="the client's id, echoed in the ack and the segment events")
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    duration_s: StrictFloat | StrictInt | None = Field(
        None, gt=0, le=MAX_SEGMENT_S, allow_inf_nan=False, description="segment length, s")
    from_segment: StrictInt | None = Field(
        None, ge=0, le=2**31, description="take this segment again: start from where it began (null: go on)")

    _prompt = field_validator("prompt")(check_prompt)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str | int) -> str | int:
        if isinstance(v, str) and not 1 <= len(v) <= MAX_DIRECTION_ID_CHARS:
            raise ValueError(f"id must have 1 to {MAX_DIRECTION_ID_CHARS} characters")
        return v

    @property
    def open_ended(self) -> bool:
        """duration_s was sent as null: run until the next direction."""
        return "duration_s" in self.model_fields_set and self.duration_s is None


class AuthMessage(_Strict):
    """First message of a stream whose client cannot send an Authorization header (browsers)."""

    type: Literal["auth"]
    token: str = Field(min_length=1, max_length=256)
