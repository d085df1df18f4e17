"""TinyWorld3Model: the `WorldModel` contract over TinyWorld 3's network (`network3.py`).

Serving imports nothing of the simulator (`world.py`): the starting picture is a shipped image
(`weights/start/<world>.png`, written by `train3.py`: the simulator's view of a held-out map, named as such),
picked by the prompt's nearest world; after it, every pixel is carried over (the warp by the learned motion, the
world memory) or sampled by the flow painter.

Per chunk (one frame): the transformer's context pass (the learned motion, the warp, the memory's recall, the
cut) is built once and memoised (`cond.memo`), every sampling step runs the painter on it, and the commit writes
the context pass's keys and values (the frame's cache entry; re-run where the commit's batch differs from the
steps'), the frame as `prev`, the view into the world memory and the camera moved by the predicted shift.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from safetensors.torch import load_file

from worldcast.models.base import (
    ChunkConditioning,
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
from worldcast.models.tinyworld import layout, memory
from worldcast.models.tinyworld.backbone import ChunkRingAttention, alibi_slopes, ring_bias, to_frame_space, to_pixels
from worldcast.models.tinyworld.family import ACTIONS, CONDITIONING, STICK_PRESS
from worldcast.models.tinyworld.network3 import ABLATIONS, TinyWorld3, TinyWorld3Config, edge_fill
from worldcast.models.tinyworld.prompts import EmbeddingStore, PromptEncoder, default_store_path

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEFAULT_WEIGHTS3 = WEIGHTS_DIR / "tinyworld3.safetensors"
#: The starting images, one per world (`train3.save_start_images`).
START_DIR = WEIGHTS_DIR / "start"
FPS = 20
#: The sampler's flow times: three deterministic rectified-flow steps (`models.base.rectified_flow_update`), the
#: painter trained at every level in (0, 1].
TIMESTEPS = (1.0, 2 / 3, 1 / 3)
PRECISIONS = PrecisionSpec(dtypes=(torch.float32, torch.bfloat16), min_psnr_db=30.0, check_chunks=4)


def make_spec3(cfg: TinyWorld3Config, *, dtype: torch.dtype = torch.float32) -> WorldModelSpec:
    """TinyWorld 3's declared geometry and state: "kv" (the ring of each frame's context keys and values), "prev"
    (the last frame), "memory" and "camera" (`memory.py`), in `dtype` where a float."""
    latent = (cfg.channels, cfg.frame_size, cfg.frame_size)
    return WorldModelSpec(
        name=f"tinyworld3-w{cfg.width}l{cfg.layers}",
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
            WorldMemorySpec("memory", side=memory.memory_side(cfg.frame_size), channels=cfg.channels,
                            reach_px=memory.memory_reach(cfg.frame_size)),
            TensorStateSpec("camera", shape=(3,), dtype=torch.int64),
        ),
        actions=ACTIONS,
        conditioning=dataclasses.replace(CONDITIONING, tensors=(("prompt", (cfg.prompt_dim,), torch.float32),)),
        default_prompt="a green meadow",
        precisions=PRECISIONS,
    )


# -- the step functions (pure tensors: the engine may compile them) --------------------------------------------


def context_step(net: TinyWorld3, prev: torch.Tensor, action: torch.Tensor, prompt: torch.Tensor,
                 k_ring: torch.Tensor, v_ring: torch.Tensor, mask: torch.Tensor, recalled: torch.Tensor,
                 held: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The context pass of one frame per session: prev (B, 1, C, h, w), action (B, 1, A), prompt (B, 1, P), the
    ring and mask as `ChunkRingAttention` takes them, the memory's recall (B, 1, C, h, w), (B, 1, 1, h, w), and the
    motion head's move dx, dy int64 (B,).

    Returns (warped, known, features, cond, cut float 0/1 (B,), k, v (B, layers, T, H, hd)).
    """
    c = net.context(prev, action, prompt, ChunkRingAttention(k_ring, v_ring, mask), shift=(dx, dy),
                    recalled=recalled, held=held)
    k = torch.stack([kk for kk, _ in c.kv], dim=1)
    v = torch.stack([vv for _, vv in c.kv], dim=1)
    return c.warped, c.known, c.features, c.cond, c.cut.float(), k, v


def paint_step(net: TinyWorld3, x_t: torch.Tensor, t: torch.Tensor, warped: torch.Tensor, known: torch.Tensor,
               features: torch.Tensor, cond: torch.Tensor, cut: torch.Tensor, edge: torch.Tensor) -> torch.Tensor:
    """One sampling step's x0: x_t (B, 1, C, h, w) at flow times t (B,) -> float32 (B, 1, C, h, w) (edge: the
    "edge" ablation's picture, `network3.edge_fill`)."""
    x0, _ = net.paint(x_t[:, 0], t, warped, known, features, cond, cut > 0.5, edge)
    return x0.float()[:, None]


def decode_step(x0: torch.Tensor) -> torch.Tensor:
    """Frames (B, F, 3, S, S) in frame space -> uint8 (B, F, S, S, 3) RGB frames."""
    B, Fr = x0.shape[:2]
    img = to_pixels(x0.flatten(0, 1))
    return img.reshape(B, Fr, *img.shape[1:])


class ChunkContext(NamedTuple):
    """One chunk's context pass as the model keeps it (`cond.memo["context"]`) for its steps and its commit."""

    warped: torch.Tensor  #: (B, C, h, w) the previous frame moved by the predicted shift, memory merged in
    known: torch.Tensor  #: (B, 1, h, w) 1 where the warp or the memory shows the pixel
    features: torch.Tensor  #: (B, pixel_features, h, w) the transformer's per-pixel context
    cond: torch.Tensor  #: (B, D) action + prompt conditioning
    cut: torch.Tensor  #: (B,) 1.0 where the frame is a cut
    k: torch.Tensor  #: (B, layers, T, H, hd) the frame's cache entry
    v: torch.Tensor
    camera: torch.Tensor  #: int64 (B, 3) the camera after the move, before a cut's new world
    read: memory.ViewCells  #: what the memory's recall read, for the commit's write
    edge: torch.Tensor  #: the "edge" ablation's picture (the warped frame otherwise)


class TinyWorld3Model(WorldModel):
    """The embedded TinyWorld 3 (module doc).

    Args:
        cfg: network config.
        net: the trained network, float32.
        theme_prompts: float32 (len(layout.THEMES), prompt_dim) mean caption embedding per world: picks the
            starting image for a prompt.
        start_images: uint8 (len(layout.THEMES), S, S, 3) the starting image of each world.
    """

    encoders_on_cpu = True
    #: the evaluation's ablations of what the painter paints, the motion kept (`network3.ABLATIONS`)
    ABLATIONS = ABLATIONS

    def __init__(self, cfg: TinyWorld3Config, net: TinyWorld3, theme_prompts: torch.Tensor,
                 start_images: np.ndarray, *, device: str | torch.device = "cpu",
                 prompt_encoder: PromptEncoder | None = None) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self._modules: dict[torch.dtype, TinyWorld3] = {torch.float32: self._prepare(net.float())}
        self.net = self._modules[torch.float32]
        self._precision = torch.float32
        self.theme_prompts = theme_prompts.float().cpu().numpy()
        if start_images.shape != (len(layout.THEMES), cfg.frame_size, cfg.frame_size, 3):
            raise ValueError(f"starting images of shape {start_images.shape}; want one {cfg.frame_size}x"
                             f"{cfg.frame_size} RGB image per world {layout.THEMES}")
        self.start_images = start_images
        self.spec = make_spec3(cfg)
        store = default_store_path()
        self.prompts = prompt_encoder or PromptEncoder(EmbeddingStore(store) if store is not None else None)
        self._slopes: torch.Tensor | None = None
        self._wrap: StepWrap | None = None
        self._tables: dict[torch.dtype, dict[str, StepFn]] = {}
        self._steps: dict[str, StepFn] = self._step_table()
        #: whether new frames show what the world memory holds (the evaluation's ablation turns it off)
        self.recall_memory = True

    def set_ablation(self, name: str | None) -> None:
        """Serve under one of `ABLATIONS` (None: as trained), in the current precision; eager steps only.

        Raises:
            ValueError: an unknown name.
        """
        if name is not None and name not in ABLATIONS:
            raise ValueError(f"unknown ablation {name!r}; one of {ABLATIONS}")
        self.net.ablate = name

    def _prepare(self, net: TinyWorld3) -> TinyWorld3:
        net = net.to(self.device).eval()
        net.painter.to(memory_format=torch.channels_last)  # oneDNN runs NHWC convolutions without reorders
        for blk in net.blocks:
            blk.dw.to(memory_format=torch.channels_last)
        for p in net.parameters():
            p.requires_grad_(False)
        return net

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, device: str | torch.device = "cpu",
                        start_dir: Path | None = None) -> TinyWorld3Model:
        """Load weights written by `train3.save_weights3` (the shipped file by default) and the starting images.

        Raises:
            FileNotFoundError: no weights at `path`, or a starting image is missing.
            ValueError: the weights were saved by another network (config fields or kind differ, or tensors
                do not fit).
        """
        path = Path(path) if path is not None else DEFAULT_WEIGHTS3
        if not path.exists():
            raise FileNotFoundError(f"TinyWorld 3 weights not found at {path}; train them with "
                                    "python -m worldcast.models.tinyworld.train3")
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["config"])
        fields = {f.name for f in dataclasses.fields(TinyWorld3Config)}
        if set(meta) != fields or meta.get("kind") != TinyWorld3Config.kind:
            raise ValueError(f"weights at {path} are not TinyWorld 3's ({meta}; this code's config has "
                             f"{sorted(fields)} and kind {TinyWorld3Config.kind!r})")
        cfg = TinyWorld3Config(**meta)
        sd = load_file(str(path))
        net = TinyWorld3(cfg)
        try:
            net.load_state_dict({k[4:]: v for k, v in sd.items() if k.startswith("net.")})
        except RuntimeError as e:
            raise ValueError(f"TinyWorld 3 weights at {path} do not match this code's network: {e}") from e
        folder = start_dir if start_dir is not None else path.parent / "start"
        images = np.stack([load_start_image(folder / f"{t}.png", cfg.frame_size) for t in layout.THEMES])
        logger.info("TinyWorld3Model: loaded %s (%d params)", path, net.num_params())
        return cls(cfg, net, sd["theme_prompts"], images, device=device)

    # -- precision and compiled steps -------------------------------------------------------

    def set_precision(self, dtype: torch.dtype) -> None:
        """float32 or bfloat16 (weights converted once per dtype; the KV ring and `prev` follow).

        Raises:
            ValueError: `dtype` is neither.
        """
        if dtype not in self.spec.precisions.dtypes:
            raise ValueError(f"{self.spec.name} runs in {list(self.spec.precisions.dtypes)}, not {dtype}")
        if dtype not in self._modules:
            self._modules[dtype] = self._prepare(copy.deepcopy(self._modules[torch.float32]).to(dtype))
        self.net = self._modules[dtype]
        self._precision = dtype
        self.spec = make_spec3(self.cfg, dtype=dtype)
        self._steps = self._step_table()

    def compile_steps(self, wrap: StepWrap | None) -> tuple[str, ...]:
        """Route "context", "paint" and "decode" through `wrap` (None: eager)."""
        if wrap != self._wrap:
            self._wrap, self._tables = wrap, {}
        self._steps = self._step_table()
        return tuple(self._steps)

    def _step_table(self) -> dict[str, StepFn]:
        table = self._tables.get(self._precision)
        if table is None:
            table = {"context": functools.partial(context_step, self.net),
                     "paint": functools.partial(paint_step, self.net), "decode": decode_step}
            if self._wrap is not None:
                table = {name: self._wrap(name, fn) for name, fn in table.items()}
            self._tables[self._precision] = table
        return table

    # -- conditioning -----------------------------------------------------------------------

    def encode_prompt(self, text: str) -> np.ndarray:
        """Prompt text -> float32 (prompt_dim,) sentence embedding."""
        return self.prompts.encode(text)

    def encode_conditioning(self, request: ConditioningRequest) -> Conditioning:
        """{"prompt": float32 (prompt_dim,)}: the request's prompt (or the default) embedded."""
        text = request.text or self.spec.default_prompt
        return {"prompt": self.prompts.encode(text, keep=text == self.spec.default_prompt)}

    def load_encoders(self) -> None:
        """Load the sentence encoder and keep the default prompt's embedding."""
        self.prompts.load()
        self.encode_conditioning(ConditioningRequest())

    def encode_action(self, keys: dict[str, bool], axes: dict[str, float]) -> np.ndarray:
        """float32 (ACTION_DIM,) `layout.action_vector` of one pixel frame (`family.ACTIONS`; sticks as in
        `TinyWorldModel.encode_action`)."""
        mx, my = axes.get("move_x", 0.0), axes.get("move_y", 0.0)
        held = dict(keys)
        for key, on in (("d", mx > STICK_PRESS), ("a", mx < -STICK_PRESS), ("s", my > STICK_PRESS),
                        ("w", my < -STICK_PRESS), ("shift", axes.get("run", 0.0) > STICK_PRESS)):
            held[key] = held.get(key, False) or on
        pan_x = axes.get("pan_x", 0.0) + axes.get("look_x", 0.0)
        pan_y = axes.get("pan_y", 0.0) + axes.get("look_y", 0.0)
        return layout.action_vector(held, (pan_x * layout.MOUSE_COUNTS_PER_PX, pan_y * layout.MOUSE_COUNTS_PER_PX))

    def theme_for(self, prompt_embedding: np.ndarray) -> str:
        """The world whose training captions lie nearest to `prompt_embedding` (cosine)."""
        return layout.THEMES[int(np.argmax(self.theme_prompts @ prompt_embedding))]

    def initial_frames(self, *, seed: int, context: Conditioning) -> np.ndarray:
        """uint8 (1, S, S, 3): the shipped starting image of the prompt's nearest world (`START_DIR`)."""
        return self.start_images[layout.THEMES.index(self.theme_for(context["prompt"]))][None].copy()

    # -- frames <-> latents --------------------------------------------------------------------

    @torch.no_grad()
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 (B, F, H, W, 3) -> float32 frame-space latents (B, F, 3, H, W)."""
        B, Fr = frames.shape[:2]
        img = frames.to(self.device).flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
        return to_frame_space(img).reshape(B, Fr, *self.spec.latent_shape)

    @torch.no_grad()
    def decode_latents(self, x0: torch.Tensor) -> torch.Tensor:
        return decode_step(x0)

    @torch.no_grad()
    def decode(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> tuple[list[torch.Tensor],
                                                                                         StateUpdates]:
        return list(self._steps["decode"](x0).unbind(0)), {}

    # -- the chunk ---------------------------------------------------------------------------------

    def _ring(self, cond: ChunkConditioning, state: StateView) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's ring (B, layers, L, H, hd) and mask (B, H, 1, L + T), once per chunk (as TinyWorld 2's)."""
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
            bias = ring_bias(kf, cond.frame_index[:, :1], self._slopes, cfg)
            own = torch.zeros((*bias.shape[:2], cfg.tokens_per_frame), device=bias.device)
            mask = torch.cat([bias, own], dim=-1)[:, :, None].to(self.precision)
            memo = cond.memo["ring"] = (k, v, mask)
        return memo  # type: ignore[return-value]

    def _context(self, cond: ChunkConditioning, state: StateView, prev: torch.Tensor | None = None,
                 ) -> ChunkContext:
        """The chunk's context pass (`context_step`), once per chunk and batch, with the memory's recall at the
        camera the predicted move leads to. `prev` (B, 1, C, h, w): the frame to continue (None: the state's)."""
        memo = cond.memo.get("context")
        if memo is None:
            if prev is None:
                prev = state.tensor("prev")[:, None]
            action, prompt = cond.action, cond.context["prompt"][:, None]
            dx, dy = self.net.motion.shift(action[:, 0].to(self.precision))
            cam = state.tensor("camera")
            camera = torch.stack([cam[:, 0] + dx, cam[:, 1] + dy, cam[:, 2]], dim=1)
            canvas, tag = state.memory("memory")
            recalled, held, read = memory.recall(canvas, tag, state.slots, camera, self.net.marker)
            if not self.recall_memory:
                recalled, held = torch.zeros_like(recalled), torch.zeros_like(held)
            out = self._steps["context"](prev, action, prompt, *self._ring(cond, state), recalled[:, None],
                                         held[:, None], dx, dy)
            edge = edge_fill(prev[:, 0].to(out[0].dtype), dx, dy) if self.net.ablate == "edge" else out[0]
            memo = cond.memo["context"] = ChunkContext(*out, camera, read, edge)
        return memo  # type: ignore[return-value]

    @torch.no_grad()
    def init_state(self, frames: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """Commit the starting image as frame 0: its context keys (the frame continuing itself, no move), `prev`,
        and its view into an empty memory at the origin of world 0."""
        z = self.encode_frames(frames)  # (B, 1, C, h, w)
        B = z.shape[0]
        k_pool, v_pool, _ = state.ring("kv")
        L = k_pool.shape[2]
        ring = (torch.zeros((B, self.cfg.layers, L, self.cfg.heads, self.cfg.head_dim), dtype=k_pool.dtype,
                            device=z.device),) * 2
        mask = torch.full((B, self.cfg.heads, 1, L + self.cfg.tokens_per_frame), float("-inf"), device=z.device)
        mask[..., L:] = 0
        zeros = torch.zeros((B, 1, 1, *z.shape[-2:]), device=z.device)
        still = torch.zeros(B, dtype=torch.int64, device=z.device)  # the frame continues itself: no move
        out = self._steps["context"](z, torch.zeros_like(cond.action), cond.context["prompt"][:, None], *ring,
                                     mask.to(self.precision), torch.zeros_like(z), zeros, still, still)
        k, v = out[5], out[6]
        camera = torch.zeros((B, 3), dtype=torch.int64, device=z.device)
        canvas, tag = state.memory("memory")
        remembered = memory.remember(canvas, tag, state.slots, camera, to_pixels(z[:, -1]), self.net.marker)
        layers = range(self.cfg.layers)
        return {"kv": RingWrite(cond.frame_index, [k[:, i] for i in layers], [v[:, i] for i in layers]),
                "prev": Replace(z[:, -1]), "memory": remembered, "camera": Replace(camera)}

    @torch.no_grad()
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        assert x_t.shape[1] == 1, "TinyWorld 3 generates one frame per chunk"
        ctx = self._context(cond, state)
        return self._steps["paint"](x_t, t, ctx.warped, ctx.known, ctx.features, ctx.cond, ctx.cut, ctx.edge)

    @torch.no_grad()
    def commit(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """The frame as shown (clamped) as `prev`; the context pass's keys and values as its cache entry; its view
        into the world memory; the camera moved by the predicted shift, a new world on a cut."""
        x0 = x0.clamp(-1, 1)
        ctx = self._context(cond, state)
        camera = torch.cat([ctx.camera[:, :2], ctx.camera[:, 2:] + (ctx.cut[:, None] > 0.5).long()], dim=1)
        canvas, tag = state.memory("memory")
        remembered = memory.remember(canvas, tag, state.slots, camera, to_pixels(x0[:, -1]), self.net.marker,
                                     ctx.read)
        layers = range(self.cfg.layers)
        return {"kv": RingWrite(cond.frame_index, [ctx.k[:, i] for i in layers], [ctx.v[:, i] for i in layers]),
                "prev": Replace(x0[:, -1]), "memory": remembered, "camera": Replace(camera)}


def load_start_image(path: Path, size: int) -> np.ndarray:
    """uint8 (size, size, 3) from a PNG (`train3.save_start_images`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a size x size RGB picture.
    """
    from PIL import Image

    if not path.exists():
        raise FileNotFoundError(f"TinyWorld 3's starting image {path} is missing; python -m "
                                "worldcast.models.tinyworld.train3 --export-only writes them")
    img = np.asarray(Image.open(path).convert("RGB"))
    if img.shape != (size, size, 3):
        raise ValueError(f"starting image {path} is {img.shape[1]}x{img.shape[0]}, not {size}x{size}")
    return img
