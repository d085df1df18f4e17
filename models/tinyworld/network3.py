"""TinyWorld 3's network: every pixel after the starting image is carried over or sampled by a learned flow model.

Reads top to bottom like nanoGPT: config, the motion head, the context transformer, the flow painter, the
network. Shapes: B batch, F frames, T tokens per frame, D width, S frame side, N = B*F.

What is learned and what is a prior (the contract of issue 51):
- **Motion is learned.** A motion head predicts the camera's move (dx, dy), each a class in
  [-max_shift, max_shift], from the frame's action (`MotionHead`); it was trained with cross-entropy on shifts
  measured from consecutive frames (`train3.measure_shifts`), never given the simulator's rule.
- **The warp is a prior.** The previous frame moved by the predicted shift shows every pixel that move can show,
  and those are copied exactly (`backbone.warp`); so is ground the world memory holds (`memory.py`).
- **Everything else is sampled.** A conditional flow model over the pixels the warp and the memory cannot show:
  a frame-causal transformer over 8x8 patches of the warped frame and its known mask (conditioned on action and
  prompt, attending earlier frames through the KV cache) gives per-pixel context features once per frame; a
  full-resolution convolutional painter, conditioned on flow time, predicts the clean pixels from noisy ones
  (rectified flow, x_t = (1 - t) x0 + t eps, Liu et al. 2022), trained at flow times drawn uniformly from (0, 1]
  and sampled in a few deterministic steps. Noise enters only as the sampler's input; no field, threshold or
  offset shapes what is drawn.
- **Cuts are learned.** A prompt that changes the world makes the transformer's cut classifier fire, and the
  painter repaints the whole frame (its known mask cleared) from the warped old frame and the new prompt.

Cost: the transformer runs once per frame (its keys and values are the frame's cache entry: a frame's tokens
describe its input, the warped previous frame, so no separate commit pass is needed), the painter once per
sampling step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.models.tinyworld.backbone import Attend, Block, _modulate, marker_mask, timestep_embedding, warp


@dataclass(frozen=True)
class TinyWorld3Config:
    """Hyperparameters of TinyWorld 3; the only source of them."""

    frame_size: int = 64  #: frame side S, pixels
    patch: int = 8  #: pixels per token, per side
    width: int = 128  #: transformer width D
    heads: int = 4  #: attention heads
    layers: int = 4  #: transformer blocks
    mlp_ratio: int = 3  #: MLP hidden = mlp_ratio * width
    action_dim: int = 8  #: action vector length (`layout.action_vector`)
    prompt_dim: int = 384  #: prompt embedding length (all-MiniLM-L6-v2)
    window_frames: int = 4  #: rolling-window frames kept in the KV cache
    sink_frames: int = 1  #: attention-sink frames kept forever
    pixel_features: int = 8  #: per-pixel context features the transformer hands the painter
    painter_width: int = 24  #: channels of the painter's convolutions
    painter_blocks: int = 3  #: residual conv blocks of the painter
    max_shift: int = 8  #: the motion head's classes per axis: -max_shift .. max_shift pixels
    #: what the network is (`from_pretrained` refuses weights of another)
    kind: str = "flow-painter"

    def __post_init__(self) -> None:
        assert self.width % self.heads == 0, "width must divide by heads"
        assert self.frame_size % self.patch == 0, "frame must tile into tokens"

    @property
    def channels(self) -> int:
        return 3

    @property
    def grid(self) -> int:
        return self.frame_size // self.patch

    @property
    def tokens_per_frame(self) -> int:
        return self.grid * self.grid

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def shift_classes(self) -> int:
        return 2 * self.max_shift + 1


# -----------------------------------------------------------------------------
# Motion


class MotionHead(nn.Module):
    """The camera's move from a frame's action: (N, A) -> logits (N, 2, 2 * max_shift + 1) over dx and dy."""

    def __init__(self, cfg: TinyWorld3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.mlp = nn.Sequential(nn.Linear(cfg.action_dim, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(),
                                 nn.Linear(64, 2 * cfg.shift_classes))

    def forward(self, action: torch.Tensor) -> torch.Tensor:
        return self.mlp(action).view(-1, 2, self.cfg.shift_classes)

    def shift(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The most likely move: int64 (N,) dx and dy, pixels (+x right, +y down). No host sync."""
        best = self(action).argmax(-1) - self.cfg.max_shift  # (N, 2)
        return best[:, 0], best[:, 1]


# -----------------------------------------------------------------------------
# The flow painter


class Painter(nn.Module):
    """Full-resolution convolutions that predict clean pixels from noisy ones (one flow step's x0).

    Input planes (N, 15, S, S): the noisy frame where unknown (3), the warped previous frame (3), the known mask
    (1), the transformer's per-pixel context (pixel_features, 8); conditioning (N, D): flow time, action and
    prompt, through FiLM in every block (zero-initialised). Output: x0 (N, 3, S, S), frame space.
    """

    def __init__(self, cfg: TinyWorld3Config) -> None:
        super().__init__()
        w = cfg.painter_width
        self.conv_in = nn.Conv2d(7 + cfg.pixel_features, w, 3, 1, 1)
        self.convs = nn.ModuleList([nn.Conv2d(w, w, 3, 1, 1) for _ in range(cfg.painter_blocks)])
        self.films = nn.ModuleList([nn.Linear(cfg.width, 2 * w) for _ in range(cfg.painter_blocks)])
        for f in self.films:
            nn.init.zeros_(f.weight)
            nn.init.zeros_(f.bias)
        self.conv_out = nn.Conv2d(w, 3, 3, 1, 1)

    def forward(self, planes: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv_in(planes))
        c = F.silu(cond)
        for conv, film in zip(self.convs, self.films, strict=True):
            scale, shift = film(c)[:, :, None, None].chunk(2, dim=1)
            h = h + F.gelu(_modulate(conv(h), shift, scale))
        return self.conv_out(h)


# -----------------------------------------------------------------------------
# The network


@dataclass
class Context:
    """What the transformer says of a batch of frames, once per frame (reused by every sampling step).

    Attributes:
        warped: (N, 3, S, S) the previous frame moved by the predicted shift (0 where unknown), memory merged in.
        known: (N, 1, S, S) 1 where the warp or the memory shows the pixel.
        features: (N, pixel_features, S, S) per-pixel context.
        cond: (N, D) action + prompt conditioning.
        cut: bool (N,) whether the frame is a cut (repainted whole).
        kv: per layer (K, V), each (B, F*T, H, hd): the frames' cache entries.
        dx, dy: int64 (N,) the predicted camera move.
    """

    warped: torch.Tensor
    known: torch.Tensor
    features: torch.Tensor
    cond: torch.Tensor
    cut: torch.Tensor
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    dx: torch.Tensor
    dy: torch.Tensor
    cut_logit: torch.Tensor


class TinyWorld3(nn.Module):
    """TinyWorld 3: motion head, context transformer, flow painter (module doc)."""

    def __init__(self, cfg: TinyWorld3Config) -> None:
        super().__init__()
        self.cfg = cfg
        d, p = cfg.width, cfg.patch
        self.motion = MotionHead(cfg)
        self.inp = nn.Linear(4 * p * p, d)
        self.pos = nn.Parameter(torch.randn(1, 1, cfg.tokens_per_frame, d) * 0.02)
        self.a_mlp = nn.Sequential(nn.Linear(cfg.action_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.p_proj = nn.Sequential(nn.Linear(cfg.prompt_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.t_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])  # type: ignore[arg-type]
        self.norm = nn.LayerNorm(d, elementwise_affine=False)
        self.ada_out = nn.Linear(d, 2 * d)
        nn.init.zeros_(self.ada_out.weight)
        nn.init.zeros_(self.ada_out.bias)
        self.out = nn.Linear(d, cfg.pixel_features * p * p)
        self.cut = nn.Linear(d, 1)
        nn.init.zeros_(self.cut.weight)
        nn.init.constant_(self.cut.bias, -3.0)  # cuts are rare
        self.painter = Painter(cfg)
        self.register_buffer("marker", marker_mask(cfg.frame_size), persistent=False)
        #: the evaluation's ablation of what the painter paints (`ABLATIONS`; None: the painter's own)
        self.ablate: str | None = None

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _patchify(self, x: torch.Tensor) -> torch.Tensor:
        p, g = self.cfg.patch, self.cfg.grid
        N, C = x.shape[:2]
        return x.reshape(N, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(N, g * g, C * p * p)

    def _unpatchify(self, x: torch.Tensor, channels: int) -> torch.Tensor:
        p, g = self.cfg.patch, self.cfg.grid
        N = x.shape[0]
        return x.reshape(N, g, g, channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(N, channels, g * p, g * p)

    def context(self, prev: torch.Tensor, action: torch.Tensor, prompt: torch.Tensor, attend: Attend, *,
                shift: tuple[torch.Tensor, torch.Tensor] | None = None, recalled: torch.Tensor | None = None,
                held: torch.Tensor | None = None, cut: torch.Tensor | None = None) -> Context:
        """The transformer's pass over F frames (once per frame).

        Args:
            prev: (B, F, 3, S, S) each frame's previous frame, frame space.
            action: (B, F, A) float32 the action that led to each frame.
            prompt: (B, F, P) prompt embeddings.
            attend: the self-attention over cached keys (`backbone.DenseAttention` or `ChunkRingAttention`).
            shift: (dx, dy) int64 (B*F,) to warp by (training: the measured shift); None: the motion head's.
            recalled, held: (B, F, 3, S, S), (B, F, 1, S, S) what the world memory holds (`memory.recall`).
            cut: bool (B*F,) the true cuts (training); None: where the cut logit is positive.
        """
        cfg = self.cfg
        B, Fr = prev.shape[:2]
        T = cfg.tokens_per_frame
        dt = self.inp.weight.dtype
        prev, action, prompt = prev.to(dt), action.to(dt), prompt.to(dt)
        a = action.flatten(0, 1)
        dx, dy = self.motion.shift(a) if shift is None else shift
        warped, known = warp(prev.flatten(0, 1), dx, dy, self.marker)
        if held is not None and recalled is not None:
            h = held.flatten(0, 1).to(dt) * (1 - known)
            warped = warped + h * recalled.flatten(0, 1).to(dt)
            known = known + h
        x = self.inp(self._patchify(torch.cat([warped, known], dim=1))).reshape(B, Fr, T, -1) + self.pos
        cond = self.a_mlp(action) + self.p_proj(prompt)  # (B, F, D)
        kv = []
        for i, blk in enumerate(self.blocks):
            x, layer_kv = blk(x, cond, attend, i)
            kv.append(layer_kv)
        x = self.norm(x)
        cut_logit = self.cut(x.mean(2))[..., 0].flatten()  # (N,)
        sh, sc = self.ada_out(F.silu(cond))[:, :, None].chunk(2, dim=-1)
        feat = self._unpatchify(self.out(_modulate(x, sh, sc)).flatten(0, 1), cfg.pixel_features)
        is_cut = (cut_logit > 0) if cut is None else cut.to(torch.bool)
        return Context(warped, known, feat, cond.flatten(0, 1), is_cut, kv, dx, dy, cut_logit)

    def paint(self, x_t: torch.Tensor, t: torch.Tensor, warped: torch.Tensor, known: torch.Tensor,
              features: torch.Tensor, cond: torch.Tensor, cut: torch.Tensor,
              edge: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One flow step's prediction over a `Context`'s frames (its warped, known, features, cond and cut).

        Args:
            x_t: (N, 3, S, S) the noisy frames at flow times t (N,).
            cut: bool (N,) frames repainted whole (nothing known).
            edge: (N, 3, S, S) the "edge" ablation's picture (`edge_fill`); unused otherwise.

        Returns:
            (x0 with the known pixels copied, the painter's own x0), both (N, 3, S, S) in the weights' dtype.
        """
        dt = self.inp.weight.dtype
        known = known * (~cut.to(torch.bool)).to(dt)[:, None, None, None]
        planes = torch.cat([x_t.to(dt) * (1 - known), warped, known, features], dim=1)
        cond = cond + self.t_mlp(timestep_embedding(t.flatten(), self.cfg.width).to(dt))
        painted = self.painter(planes, cond)
        if self.ablate == "constant":  # the evaluation's ablation: every painted pixel one colour per frame
            mean = (warped * known).sum((2, 3), keepdim=True) / known.sum((2, 3), keepdim=True).clamp_min(1)
            painted = mean.expand_as(painted)
        elif self.ablate == "edge":  # ... or the known pixel nearest along the move (`edge`)
            painted = edge
        return torch.where(known > 0, warped, painted), painted


#: The ablations of what the network paints, the motion kept (`TinyWorld3.ablate`): one colour per frame (the
#: mean of what the warp shows), or copying the edge (each revealed pixel the known pixel its strip continues).
ABLATIONS = ("constant", "edge")


def edge_fill(prev: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The previous frames (N, 3, S, S) moved by (dx, dy) int64 (N,) with every pixel the move cannot show taken
    from the nearest pixel of the previous view along the move (its source clamped into the view)."""
    N, C, S, _ = prev.shape
    r = torch.arange(S, device=prev.device)
    ys = (r[None] + dy[:, None]).clamp(0, S - 1)
    xs = (r[None] + dx[:, None]).clamp(0, S - 1)
    src = (ys[:, :, None] * S + xs[:, None, :]).flatten(1)
    return prev.flatten(2).gather(2, src[:, None].expand(-1, C, -1)).view(N, C, S, S)


def train_times(n: int, g: torch.Generator) -> torch.Tensor:
    """Flow times for training, (n,) float32 drawn uniformly from (0, 1]: every level a sampler may step from."""
    return 1 - torch.rand(n, generator=g)
