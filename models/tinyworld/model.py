"""TinyWorldModel: the `WorldModel` contract over TinyWorld's network and weights.

TinyWorld works in pixel space: its "latents" are frames (3, 64, 64) in
[-1, 1] (`network.to_frame_space`). Serving runs three pure-tensor step
functions (`denoise_step`, `commit_step`, `decode_step`), which the engine may
compile (`compile_steps`), in float32 or bfloat16 (`set_precision`: the
weights are converted once per dtype and kept; the state pool's KV ring and
previous frame follow the dtype). Per
chunk the model builds the batch's ring (a view of the pool when the slots
are one contiguous run, else one gather) and the attention mask once; every
step reuses them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from worldcast.models.base import (
    ChunkConditioning,
    MemoryWrite,
    Replace,
    RingWrite,
    StateUpdates,
    StateView,
    StepFn,
    StepWrap,
    WorldModel,
)
from worldcast.models.spec import (
    AttentionRingSpec,
    Conditioning,
    ConditioningRequest,
    PrecisionSpec,
    TensorStateSpec,
    WorldMemorySpec,
    WorldModelSpec,
)
from worldcast.models.tinyworld import layout, memory, world
from worldcast.models.tinyworld.family import ACTIONS, CONDITIONING, STICK_PRESS
from worldcast.models.tinyworld.backbone import ring_bias
from worldcast.models.tinyworld.network import (
    DRAW_PLANES,
    ChunkRingAttention,
    TinyWorldConfig,
    TinyWorldDenoiser,
    alibi_slopes,
    camera_shift,
    carry_noise,
    noise_canvas_side,
    to_frame_space,
    to_pixels,
    warp,
)
from worldcast.models.tinyworld.prompts import EmbeddingStore, PromptEncoder, default_store_path

logger = logging.getLogger(__name__)

#: The shipped weights.
DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "tinyworld.safetensors"

#: Frames per second the model was trained to depict (camera speeds are per frame).
FPS = 20
#: Denoising passes' flow times: one pass from pure noise, which paints the expected terrain and draws the
#: objects from their predicted probability (`network.draw_objects`), then the commit. (The first TinyWorld 2
#: weights, commit 913aac7, took three deterministic passes and still painted the mean: MODEL_CARD.md.)
TIMESTEPS = (1.0,)

#: float32 (the reference) or bfloat16; bfloat16 qualifies when every frame of the warm-up check keeps
#: at least 30 dB PSNR against float32's (measured in `make evaluate`'s warm-up: 64.6 dB over four chunks
#: from the shipped weights, `play_test.served_way` in weights/eval/report.json, beside its evaluation bars).
PRECISIONS = PrecisionSpec(dtypes=(torch.float32, torch.bfloat16), min_psnr_db=30.0, check_chunks=4)


def make_spec(cfg: TinyWorldConfig, *, dtype: torch.dtype = torch.float32) -> WorldModelSpec:
    """The declared geometry and per-session state of TinyWorld with config `cfg`, computing in `dtype`.

    State: "kv", the self-attention ring (sink + rolling window of frames), and
    "prev", the last committed frame (each frame starts from it, warped by its action),
    both in `dtype`; "noise", float32 (2, C, C), the canvas of noise objects and terrain are drawn
    from, carried with the camera (`network.carry_noise`; C = S + 2 * `network.DRAW_MARGIN_PX`); "memory", the
    world memory (`memory.py`: a canvas of `memory.MEMORY_VIEWS` views on a side, uint8 RGB and an int32 tag
    per world pixel), and "camera", int64 (3,) the view's corner in world pixels and the world's number.
    Latents are frames (3, S, S) in frame space, one per chunk; the init step commits the initial picture
    as frame 0. Conditioning: a text prompt, encoded as "prompt" float32 (prompt_dim,), a sentence
    embedding, part of every chunk.
    """
    latent = (cfg.channels, cfg.frame_size, cfg.frame_size)
    canvas = noise_canvas_side(cfg.frame_size)
    return WorldModelSpec(
        name=f"tinyworld-w{cfg.width}l{cfg.layers}",
        frame_height=cfg.frame_size,
        frame_width=cfg.frame_size,
        fps=FPS,
        latent_frames_per_chunk=1,
        timesteps=TIMESTEPS,
        latent_shape=latent,
        states=(
            AttentionRingSpec("kv", layers=cfg.layers, heads=cfg.heads, head_dim=cfg.head_dim,
                              tokens_per_frame=cfg.tokens_per_frame, window_frames=cfg.window_frames,
                              sink_frames=cfg.sink_frames, dtype=dtype),
            TensorStateSpec("prev", shape=latent, dtype=dtype),
            TensorStateSpec("noise", shape=(DRAW_PLANES, canvas, canvas), dtype=torch.float32),
            WorldMemorySpec("memory", side=memory.memory_side(cfg.frame_size), channels=cfg.channels,
                            reach_px=memory.memory_reach(cfg.frame_size)),
            TensorStateSpec("camera", shape=(3,), dtype=torch.int64),
        ),
        actions=ACTIONS,
        conditioning=dataclasses.replace(CONDITIONING, tensors=(("prompt", (cfg.prompt_dim,), torch.float32),)),
        default_prompt="a green meadow",
        precisions=PRECISIONS,
    )


# -- the step functions (pure tensors: the engine may compile them, `models.base.StepFn`) -------------------


def denoise_step(net: TinyWorldDenoiser, x_t: torch.Tensor, prev: torch.Tensor, t: torch.Tensor,
                 action: torch.Tensor, prompt: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor,
                 mask: torch.Tensor, draw_noise: torch.Tensor, recalled: torch.Tensor,
                 held: torch.Tensor) -> torch.Tensor:
    """One denoising pass: noisy latents (B, F, C, h, w) at flow times t (B, F) -> float32 x0 (B, F, C, h, w).

    action (B, F, A), prompt (B, F, P); k_ring, v_ring (B, layers, L, H, hd), mask (B, H, 1, L + F*T)
    as `ChunkRingAttention` takes them; draw_noise float32 (B, F, 1, h, w) the noise objects are drawn
    from (`network.carry_noise`); recalled float32 (B, F, C, h, w) and held (B, F, 1, h, w) what the world
    memory holds of the view (`memory.recall`). Computes in the weights' dtype.
    """
    x0, _ = net(x_t, prev, t, action, prompt, ChunkRingAttention(k_ring, v_ring, mask), draw_noise=draw_noise,
                recalled=recalled, held=held)
    assert x0 is not None
    return x0.float()


def commit_step(net: TinyWorldDenoiser, x0: torch.Tensor, prev: torch.Tensor, t: torch.Tensor,
                action: torch.Tensor, prompt: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The commit pass over clean latents x0 (B, F, C, h, w) at flow time t (B, F) (0): the chunk's keys and
    values, each (B, layers, F*T, H, hd) in the weights' dtype (the last block computes only its K/V)."""
    _, kv = net(x0, prev, t, action, prompt, ChunkRingAttention(k_ring, v_ring, mask), kv_only=True)
    return torch.stack([k for k, _ in kv], dim=1), torch.stack([v for _, v in kv], dim=1)


def decode_step(x0: torch.Tensor) -> torch.Tensor:
    """Frames (B, F, 3, S, S) in frame space -> uint8 (B, F, S, S, 3) RGB frames."""
    B, Fr = x0.shape[:2]
    img = to_pixels(x0.flatten(0, 1))
    return img.reshape(B, Fr, *img.shape[1:])


def save_weights(
    path: Path, cfg: TinyWorldConfig, net: TinyWorldDenoiser, theme_prompts: torch.Tensor
) -> None:
    """Write the denoiser and theme prompt centroids to one safetensors file (the config in its metadata)."""
    tensors = {f"net.{k}": v.detach().contiguous() for k, v in net.state_dict().items()}
    tensors["theme_prompts"] = theme_prompts.contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"config": json.dumps(cfg.__dict__)})


class TinyWorldModel(WorldModel):
    """The embedded default world model.

    Args:
        cfg: network config.
        net: the trained denoiser, float32 (moved to `device`, eval mode).
        theme_prompts: float32 (len(world.THEMES), prompt_dim) mean caption
            embedding per theme; picks the initial frame's theme for a prompt.
        prompt_encoder: shared sentence encoder (None: one of its own, keeping the default prompt's
            embedding in `prompts.default_store_path()`).

    Attributes:
        net: the denoiser of the current precision (`set_precision`).
    """

    encoders_on_cpu = True  #: the sentence encoder runs on the CPU (`prompts.PromptEncoder`)
    #: the evaluation's ablations (`set_ablation`): the network's terrain height and object probability replaced
    #: by constants (0.5, 0.025), the drawing kept; the network alone (its expected picture, no drawing)
    ABLATIONS = ("constants", "network-alone")

    def __init__(
        self,
        cfg: TinyWorldConfig,
        net: TinyWorldDenoiser,
        theme_prompts: torch.Tensor,
        *,
        device: str | torch.device = "cpu",
        prompt_encoder: PromptEncoder | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        #: dtype -> denoiser, converted once each
        self._modules: dict[torch.dtype, TinyWorldDenoiser] = {torch.float32: self._prepare(net.float())}
        self.net = self._modules[torch.float32]
        self._precision = torch.float32
        self.theme_prompts = theme_prompts.float().cpu().numpy()
        self.spec = make_spec(cfg)
        store = default_store_path()
        self.prompts = prompt_encoder or PromptEncoder(EmbeddingStore(store) if store is not None else None)
        self._maps: dict[int, world.WorldMap] = {}
        self._slopes: torch.Tensor | None = None  #: ALiBi slopes on the device (a constant)
        self._wrap: StepWrap | None = None
        self._tables: dict[torch.dtype, dict[str, StepFn]] = {}  #: per dtype, its steps as `_wrap` wrapped them
        self._steps: dict[str, StepFn] = self._step_table()
        #: whether new frames show what the world memory holds (the evaluation turns it off for its ablation;
        #: the memory is written either way)
        self.recall_memory = True

    def set_ablation(self, name: str | None) -> None:
        """Serve under one of `ABLATIONS` (None: as trained), in the current precision; eager steps only (a
        compiled step bakes in what it traced).

        Raises:
            ValueError: an unknown name.
        """
        if name is not None and name not in self.ABLATIONS:
            raise ValueError(f"unknown ablation {name!r}; one of {self.ABLATIONS}")
        self.net.ablate = "constants" if name == "constants" else None
        self.net.draw = name != "network-alone"

    def _prepare(self, net: TinyWorldDenoiser) -> TinyWorldDenoiser:
        # channels-last convolutions: the MLP's depthwise conv reads the token grid (B*F, g, g, hidden)
        # as an NHWC view with no copy, and oneDNN runs NHWC convs without reordering their input
        net = net.to(self.device).eval()
        net.draw = True  # serving draws each frame's objects (`network.draw_objects`)
        for blk in net.blocks:
            blk.dw.to(memory_format=torch.channels_last)
        for p in net.parameters():
            p.requires_grad_(False)
        return net

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, device: str | torch.device = "cpu") -> TinyWorldModel:
        """Load weights written by `save_weights` (the shipped file by default).

        Raises:
            FileNotFoundError: no weights at `path`.
            ValueError: the weights were saved by another network (their config's fields or painter differ
                from this code's, or their tensors do not fit it).
        """
        path = Path(path) if path is not None else DEFAULT_WEIGHTS
        if not path.exists():
            raise FileNotFoundError(f"TinyWorld weights not found at {path}; train them with "
                                    "python -m worldcast.models.tinyworld.train")
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["config"])
        fields = {f.name for f in dataclasses.fields(TinyWorldConfig)}
        if set(meta) != fields or meta.get("painter") != TinyWorldConfig.painter:
            raise ValueError(f"TinyWorld weights at {path} were trained for another network ({meta}; this code's "
                             f"config has {sorted(fields)} and painter {TinyWorldConfig.painter!r}); retrain them "
                             "with python -m worldcast.models.tinyworld.train")
        cfg = TinyWorldConfig(**meta)
        sd = load_file(str(path))
        net = TinyWorldDenoiser(cfg)
        try:
            net.load_state_dict({k[4:]: v for k, v in sd.items() if k.startswith("net.")})
        except RuntimeError as e:
            raise ValueError(f"TinyWorld weights at {path} do not match this code's network: {e}") from e
        logger.info("TinyWorldModel: loaded %s (%d params)", path, net.num_params())
        return cls(cfg, net, sd["theme_prompts"], device=device)

    # -- precision and compiled steps ------------------------------------------------------

    def set_precision(self, dtype: torch.dtype) -> None:
        """Compute in float32 or bfloat16: weights converted once per dtype (kept), the state's KV ring and
        previous frame declared in `dtype` (`spec` is replaced).

        Raises:
            ValueError: `dtype` is neither.
        """
        if dtype not in self.spec.precisions.dtypes:
            raise ValueError(f"{self.spec.name} runs in {list(self.spec.precisions.dtypes)}, not {dtype}")
        if dtype not in self._modules:
            self._modules[dtype] = self._prepare(copy.deepcopy(self._modules[torch.float32]).to(dtype))
            logger.info("TinyWorldModel: weights converted to %s", dtype)
        self.net = self._modules[dtype]
        self._precision = dtype
        self.spec = make_spec(self.cfg, dtype=dtype)
        self._steps = self._step_table()

    def compile_steps(self, wrap: StepWrap | None) -> tuple[str, ...]:
        """Route "denoise", "commit" and "decode" through `wrap` (None: eager), in every precision (each
        precision's steps are wrapped once per `wrap`)."""
        if wrap != self._wrap:  # (bound methods compare equal, never identical)
            self._wrap, self._tables = wrap, {}
        self._steps = self._step_table()
        return tuple(self._steps)

    def _step_table(self) -> dict[str, StepFn]:
        table = self._tables.get(self._precision)
        if table is None:
            table = {"denoise": functools.partial(denoise_step, self.net),
                     "commit": functools.partial(commit_step, self.net),
                     "decode": decode_step}
            if self._wrap is not None:
                table = {name: self._wrap(name, fn) for name, fn in table.items()}
            self._tables[self._precision] = table
        return table

    # -- conditioning --------------------------------------------------------------

    def encode_prompt(self, text: str) -> np.ndarray:
        """Prompt text -> float32 (prompt_dim,) sentence embedding."""
        return self.prompts.encode(text)

    def encode_conditioning(self, request: ConditioningRequest) -> Conditioning:
        """{"prompt": float32 (prompt_dim,)}: the request's prompt (or the default one) embedded. The default
        prompt's embedding is kept on disk (`prompts.EmbeddingStore`): a warm-up with a warm cache, or an
        engine process, embeds it without loading the encoder."""
        text = request.text or self.spec.default_prompt
        return {"prompt": self.prompts.encode(text, keep=text == self.spec.default_prompt)}

    def load_encoders(self) -> None:
        """Load the sentence encoder (about 10 s on a 2-vCPU VM) and keep the default prompt's embedding."""
        self.prompts.load()
        self.encode_conditioning(ConditioningRequest())

    def encode_action(self, keys: dict[str, bool], axes: dict[str, float]) -> np.ndarray:
        """float32 (ACTION_DIM,) `world.action_vector` of one pixel frame (`family.ACTIONS` says what drives what).

        A stick past `family.STICK_PRESS` holds the key of its direction and the trigger past it holds shift (the
        network was trained on keys held or not); the right stick's pan (pixels, model units) adds to the mouse's.
        """
        press = STICK_PRESS
        mx, my = axes.get("move_x", 0.0), axes.get("move_y", 0.0)
        held = dict(keys)
        for key, on in (("d", mx > press), ("a", mx < -press), ("s", my > press), ("w", my < -press),
                        ("shift", axes.get("run", 0.0) > press)):
            held[key] = held.get(key, False) or on
        pan_x = axes.get("pan_x", 0.0) + axes.get("look_x", 0.0)
        pan_y = axes.get("pan_y", 0.0) + axes.get("look_y", 0.0)
        return layout.action_vector(held, (pan_x * layout.MOUSE_COUNTS_PER_PX, pan_y * layout.MOUSE_COUNTS_PER_PX))

    def theme_for(self, prompt_embedding: np.ndarray) -> str:
        """The simulator theme whose captions lie nearest to `prompt_embedding` (cosine)."""
        return layout.THEMES[int(np.argmax(self.theme_prompts @ prompt_embedding))]

    def initial_frames(self, *, seed: int, context: Conditioning) -> np.ndarray:
        """uint8 (1, 64, 64, 3): the simulator's view at the origin of world `seed`, in the prompt's theme."""
        prompt = context["prompt"]
        if seed not in self._maps:
            if len(self._maps) > 64:
                self._maps.clear()
            self._maps[seed] = world.WorldMap.generate(seed)
        return world.render_view(self._maps[seed], self.theme_for(prompt), 0, 0, view=self.cfg.frame_size)[None]

    # -- frames <-> latents ---------------------------------------------------------------

    @torch.no_grad()
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 (B, F, H, W, 3) RGB frames -> float32 frame-space latents (B, F, 3, H, W)."""
        B, Fr = frames.shape[:2]
        img = frames.to(self.device).flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
        return to_frame_space(img).reshape(B, Fr, *self.spec.latent_shape)

    @torch.no_grad()
    def decode_latents(self, x0: torch.Tensor) -> torch.Tensor:
        """Latents (B, F, C, h, w) -> uint8 (B, F, H, W, 3) RGB frames (eager; offline evaluation)."""
        return decode_step(x0)

    @torch.no_grad()
    def decode(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> tuple[list[torch.Tensor],
                                                                                         StateUpdates]:
        """Each latent is a frame: clamped and rounded to uint8; no state."""
        return list(self._steps["decode"](x0).unbind(0)), {}

    # -- denoise / commit ------------------------------------------------------------------

    def _ring(self, cond: ChunkConditioning, state: StateView) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's ring keys and values (B, layers, L, H, hd) and the attention mask (B, H, 1, L + T),
        built once per chunk (`cond.memo`) and reused by its every pass.

        The ring is a view of the pool for one contiguous run of slots, else gathered once. The mask
        is the rule of `kernels/ring_attention.py` for a one-frame chunk starting at c0: a ring frame
        j is visible iff it holds data and c0 - window <= j < c0 or j < sinks; its bias is -slope * age
        with age = c0 - j, capped at window + 1 for sinks; the chunk's own keys are all visible (bias 0).
        """
        memo = cond.memo.get("ring")
        if memo is None:
            cfg = self.cfg
            k_pool, v_pool, ring_frame = state.ring("kv")
            s = state.slots_host
            if s == tuple(range(s[0], s[0] + len(s))):
                k, v, kf = k_pool[s[0]:s[0] + len(s)], v_pool[s[0]:s[0] + len(s)], ring_frame[s[0]:s[0] + len(s)]
            else:
                k, v, kf = (x.index_select(0, state.slots) for x in (k_pool, v_pool, ring_frame))
            if self._slopes is None or self._slopes.device != k_pool.device:
                self._slopes = alibi_slopes(cfg.heads).to(k_pool.device)
            bias = ring_bias(kf, cond.frame_index[:, :1], self._slopes, cfg)  # (B, H, L)
            own = torch.zeros((*bias.shape[:2], cfg.tokens_per_frame), device=bias.device)  # (B, H, T)
            mask = torch.cat([bias, own], dim=-1)[:, :, None].to(self.precision)  # (B, H, 1, L + T)
            memo = cond.memo["ring"] = (k, v, mask)
        return memo  # type: ignore[return-value]

    def _prompt(self, cond: ChunkConditioning, frames: int) -> torch.Tensor:
        return cond.context["prompt"][:, None].expand(-1, frames, -1)  # (B, F, P)

    def _commit(self, x0: torch.Tensor, prev: torch.Tensor, noise: torch.Tensor, camera: torch.Tensor,
                cond: ChunkConditioning, state: StateView) -> StateUpdates:
        zeros = torch.zeros(x0.shape[:2], device=x0.device)
        k, v = self._steps["commit"](x0, prev, zeros, cond.action, self._prompt(cond, x0.shape[1]),
                                     *self._ring(cond, state))
        layers = range(self.cfg.layers)
        canvas, tag = state.memory("memory")
        read = None if "memory" not in cond.memo else cond.memo["memory"][2]  # type: ignore[index]
        remembered: MemoryWrite = memory.remember(canvas, tag, state.slots, camera, to_pixels(x0[:, -1]),
                                                  self.net.marker, read)
        return {"kv": RingWrite(cond.frame_index, [k[:, i] for i in layers], [v[:, i] for i in layers]),
                "prev": Replace(x0[:, -1]), "noise": Replace(noise), "memory": remembered,
                "camera": Replace(camera)}

    def _camera_after(self, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        """int64 (B, 3): each session's camera (`memory.py`) after its chunk's move, in the same world."""
        cam = state.tensor("camera")
        dx, dy = camera_shift(cond.action[:, 0])
        return torch.stack([cam[:, 0] + dx, cam[:, 1] + dy, cam[:, 2]], dim=1)

    def recall(self, cond: ChunkConditioning, state: StateView) -> tuple[torch.Tensor, torch.Tensor]:
        """What the world memory holds of each session's next view (`memory.recall`): recalled float32
        (B, 1, C, h, w) and held (B, 1, 1, h, w); built once per chunk and batch (the cells' contents are kept
        for the commit's write). With `recall_memory` off (the evaluation's ablation) nothing is held."""
        memo = cond.memo.get("memory")
        if memo is None:
            canvas, tag = state.memory("memory")
            values, held, now = memory.recall(canvas, tag, state.slots, self._camera_after(cond, state),
                                              self.net.marker)
            if not self.recall_memory:
                values, held = torch.zeros_like(values), torch.zeros_like(held)
            memo = cond.memo["memory"] = (values[:, None], held[:, None], now)
        return memo[0], memo[1]  # type: ignore[index]

    def draw_noise(self, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        """The chunk's draw noise (B, 1, 2, C, C) float32: the state's canvas, carried with the camera, fresh where
        the move brings it onto new positions from the chunk's initial noise (`ChunkConditioning.noise`, the x_t
        its first pass starts from, `network.fresh_canvas`); the same in every batch the chunk's steps and commit
        run in.

        Raises:
            ValueError: the conditioning carries no initial noise (an init step).
        """
        memo = cond.memo.get("draw_noise")
        if memo is None:
            if cond.noise is None:
                raise ValueError("TinyWorld draws from the chunk's initial noise; this chunk's conditioning has none")
            fresh = cond.noise[:, 0].flatten(1).float()  # (B, C*h*w)
            memo = cond.memo["draw_noise"] = carry_noise(state.tensor("noise"), fresh, cond.action[:, 0])[:, None]
        return memo

    @torch.no_grad()
    def init_state(self, frames: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """Commit the initial picture as latent frame 0: its keys and values, and it as `prev`."""
        z = self.encode_frames(frames)  # (B, 1, C, h, w)
        # the first view's draw noise: zeros (no object is drawn in it; the first strips' draws lean on fresh noise)
        camera = torch.zeros((z.shape[0], 3), dtype=torch.int64, device=z.device)  # the origin of world 0
        return self._commit(z, z, torch.zeros_like(state.tensor("noise")), camera, cond, state)

    @torch.no_grad()
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        assert x_t.shape[1] == 1, "TinyWorld generates one frame per chunk"
        prev = state.tensor("prev")[:, None]  # (B, 1, C, h, w)
        tt = t[:, None].expand(-1, x_t.shape[1]).contiguous()
        return self._steps["denoise"](x_t, prev, tt, cond.action, self._prompt(cond, x_t.shape[1]),
                                      *self._ring(cond, state), self.draw_noise(cond, state),
                                      *self.recall(cond, state))

    @torch.no_grad()
    def commit(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """The clean pass at flow time 0 over the frame as shown (clamped to [-1, 1]): the chunk's keys and
        values, its last frame as `prev`, its draw noise as `noise`, its view into the world memory and the
        camera moved by its action; a cut (the network repainted the ground the warp showed: a prompt that
        changed the world) starts a new world, whose memory starts empty."""
        x0 = x0.clamp(-1, 1)
        prev = state.tensor("prev")
        camera = self._camera_after(cond, state)
        dx, dy = camera_shift(cond.action[:, 0])
        warped, known = warp(prev, dx, dy, self.net.marker)  # (B, C, h, w), (B, 1, h, w)
        repainted = (x0[:, -1] != warped.float()).any(1, keepdim=True).float() * known
        cut = repainted.sum((1, 2, 3)) > 0.5 * known.sum((1, 2, 3))  # (B,) kept pixels equal the warp exactly
        camera = torch.cat([camera[:, :2], camera[:, 2:] + cut[:, None].long()], dim=1)
        return self._commit(x0, prev[:, None], self.draw_noise(cond, state)[:, 0], camera, cond, state)
