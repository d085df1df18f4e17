"""TinyWorld's network: a frame-causal transformer over pixel patches that paints each new frame.

Reads top to bottom like nanoGPT: config, the camera warp and the palette,
attention bias, transformer block, the pixel head, the denoiser. Shapes in
comments use B batch, F frames, T tokens per frame, D width, H heads,
hd head dim, L cached key tokens, S frame side, N = B*F.

Design (TinyWorld 2; why it keeps a world alive on a CPU budget):
- Pixel space, no autoencoder: a frame is (3, 64, 64) in [-1, 1]. TinyWorld 1's
  autoencoder alone kept 38-71 % of the simulator's texture (model-notes.md);
  here nothing sits between the prediction and the picture.
- Camera warp: a held key or a mouse pan moves the camera by a known number of
  pixels (the action space's own definition, `world.camera_step`), so every frame
  sees the previous frame already shifted by its action, with a mask of which
  pixels that shift could fill (new content enters at the edges; the player
  marker is a screen-space overlay, not world content). Known pixels are copied
  exactly, not re-predicted, so texture does not decay over minutes (the
  "residual bias" of model-notes.md taken to pixels, as ego-motion-conditioned
  world models warp by a known pose); the network imagines the rest: the
  revealed strip and the marker. A soft keep gate was tried first and hedged
  (kept only part of each pixel, so a picture faded within a second): copying
  is exact or not at all.
- Cuts: a prompt that changes the world repaints the whole frame. A per-frame
  classifier (pooled tokens; trained on the simulator's own switches) says
  when; serving thresholds it, so a frame is either kept-and-extended or cut.
- Painting as the world is drawn: three world colours predicted from the prompt
  (low and high terrain, object) and two overlay colours allowed only on the
  marker (`world.PALETTES`, `world.render_view`). Per pixel the network predicts
  a terrain height (a mix of the two terrain colours, smooth and nearly
  certain) and the probability that an object covers the pixel (trained with
  cross-entropy against the simulator's object coverage, so it is calibrated).
- Drawn objects: an MSE-trained painter paints the mean wherever the future is
  uncertain, and a new object at the edge always is: the first TinyWorld 2
  weights (commit 913aac7) painted their strips in the terrain's mean
  continuation and lost their objects (MODEL_CARD.md). Training and passes
  below flow time 1 paint the expected picture; serving *draws* the objects:
  a pixel is object where a smooth, object-sized standard normal field lies
  below the probability's normal quantile (a Gaussian copula, `draw_objects`).
  The field's noise lives in world coordinates, on a canvas reaching past the
  view (`carry_noise`): it moves with the camera like the picture, so the next
  strip is drawn from the same field as the last and an object comes out as
  one blob, not as combs; once painted, it is copied like any known pixel.
- Drawn terrain: the painter's height for a revealed strip is the expected
  continuation of the known edge, and walking extruded that edge into bands.
  Serving adds the increment of a second world-anchored field between each
  revealed pixel and the edge pixel it continues (`draw_terrain`), sized to
  the simulator's terrain statistics, so the terrain varies along the walk as
  the simulator's does and never drifts (the increments telescope).
- A full-resolution convolutional pixel head turns the transformer's per-patch
  features into those per-pixel planes, so edges are per pixel, not per 8x8 patch.
- Frames attend causally to a bounded set of earlier frames (a rolling window
  plus attention-sink frames; Xiao et al. 2023), with ALiBi-style biases over
  frame age (Press et al. 2022): no absolute time position, so positions never
  run out.
- Conditioning (flow time, action, prompt embedding) modulates every block
  through adaLN-Zero (Peebles & Xie 2023, DiT) and the pixel head through FiLM
  (Perez et al. 2018).
- The denoiser predicts the clean frame x0 under the rectified-flow
  interpolation x_t = (1 - t) x0 + t eps (Liu et al. 2022).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.backbone import (  # noqa: F401  (re-exported: the shared parts)
    Attend,
    Block,
    ChunkRingAttention,
    DenseAttention,
    _modulate,
    alibi_slopes,
    frame_age_bias,
    frame_age_bias_lazy,
    marker_mask,
    timestep_embedding,
    to_frame_space,
    to_pixels,
    warp,
)

#: Colours the network paints with: three world colours from the prompt (low terrain, high terrain, object),
#: then two overlay colours.
WORLD_COLOURS = 3
OVERLAY_COLOURS = 2
PALETTE = WORLD_COLOURS + OVERLAY_COLOURS
#: The pixel head's output planes: terrain height logit, object logit, then the layer logits of (world, overlay 1,
#: overlay 2).
HEIGHT, OBJECT, LAYERS = 0, 1, slice(2, 5)
HEAD_PLANES = 2 + 1 + OVERLAY_COLOURS
#: Smoothing (pixels, Gaussian sigma) of the field objects are drawn from (`draw_objects`): about the simulator's
#: objects (discs of radius 2-5 px, `world.WorldMap.generate`). Chosen between 4 and 6 px on the tuning seeds
#: (3,000,000 on, not the play test's) through the served path by `python -m worldcast.models.tinyworld.playtest`
#: (model card, *Serving settings*): 6 px draws fewer, larger blobs, so one 20 s window of one world held
#: 0.44-3.49x the simulator's objects; 4 px, more and smaller ones, 0.72-2.79x.
DRAW_SIGMA_PX = 4.0
#: Smoothing (pixels, Gaussian sigma) of the terrain height a serving pass paints (`smooth_height`). The
#: simulator's height is value noise on 32- and 16-pixel cells (`world.WorldMap.generate`), so this takes
#: nothing from it; chosen among 1-2 px on offline rollouts of the tuning seeds.
TERRAIN_SIGMA_PX = 2.0
#: Offset added to the object logit before objects are drawn (a one-parameter recalibration of the served
#: sampler, as Platt scaling is): under its own drawn context the network expects more objects than under the
#: simulator's it was trained on: with a 4-px field and drawn terrain the drawn share ran 1.26x the simulator's
#: (geometric mean over the six worlds at minutes 1 and 5 of the tuning seeds), and a log-linear fit of the share
#: against the offset (about -1 in log share per unit, measured between 0 and -0.4) puts 1x at -0.24.
DRAW_LOGIT_OFFSET = -0.24
#: Smoothing (pixels, Gaussian sigma) of the field the terrain's variation is drawn from (`draw_terrain`) and its
#: size in height units: the simulator's terrain (`world.WorldMap.generate`) has the structure function
#: E[(h(x + d) - h(x))^2] = 0.00073, 0.0029, 0.0105, 0.031 at d = 2, 4, 8, 16 px, which a unit Gaussian field of
#: sigma 8 px scaled by 0.155 matches within 10 % (2 (1 - exp(-d^2 / 4 sigma^2)) alpha^2; computed over 20 maps).
#: Serving takes sigma 7 px (the largest the noise canvas's margin holds, `DRAW_MARGIN_PX`).
TERRAIN_FIELD_SIGMA_PX = 7.0
TERRAIN_DRAW_SCALE = 0.155
#: Margin (pixels) of the draw noise's canvas beyond each side of the view (`carry_noise`): at least the
#: reach, ceil(3 sigma), of the widest field drawn from it, so every field over the view is a function of noise
#: anchored to the world alone.
DRAW_MARGIN_PX = 22
#: Planes of the draw noise's canvas: the objects' field, the terrain's field (independent).
DRAW_PLANES = 2
#: The object logit of the "constants" ablation (`TinyWorldDenoiser.ablate`): probability 0.025, about the
#: simulator's object share; not a fit, a round number near it (model-notes.md's outside ablation used it).
ABLATION_OBJECT_LOGIT = math.log(0.025 / 0.975)
#: Input planes per pixel: the noisy frame where the warp cannot show the pixel (3), the warped previous frame (3),
#: the known mask (1).
INPUT_PLANES = 7


@dataclass(frozen=True)
class TinyWorldConfig:
    """Hyperparameters of TinyWorld; the only source of them."""

    frame_size: int = 64  #: frame side S, pixels
    patch: int = 8  #: pixels per token, per side
    width: int = 128  #: transformer width D
    heads: int = 4  #: attention heads H
    layers: int = 4  #: transformer blocks
    mlp_ratio: int = 3  #: MLP hidden = mlp_ratio * width
    action_dim: int = 8  #: action vector length (see world.action_vector)
    prompt_dim: int = 384  #: prompt embedding length (all-MiniLM-L6-v2)
    window_frames: int = 4  #: rolling-window frames kept in the KV cache
    sink_frames: int = 1  #: attention-sink frames kept forever
    pixel_features: int = 8  #: per-pixel features the transformer hands the pixel head
    head_width: int = 24  #: channels of the pixel head's convolutions
    #: what the pixel head's planes mean (`paint`): terrain height, object probability, layers. Weights saved with
    #: another (or none: the first TinyWorld 2 weights mixed a 5-colour palette) are refused on loading.
    painter: str = "height-object"

    def __post_init__(self) -> None:
        assert self.width % self.heads == 0, "width must divide by heads"
        assert self.frame_size % self.patch == 0, "frame must tile into tokens"

    @property
    def channels(self) -> int:
        """Channels of a frame (RGB)."""
        return 3

    @property
    def grid(self) -> int:
        """Token grid side."""
        return self.frame_size // self.patch

    @property
    def tokens_per_frame(self) -> int:
        return self.grid * self.grid

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


# -----------------------------------------------------------------------------
# Frames, the camera warp and the palette


def camera_shift(action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The camera's move (dx, dy) in pixels for actions (..., A): `world.camera_step` as tensor ops.

    W/S move up/down, A/D left/right by `world.WALK_PX` (doubled with Shift), mouse pans
    (action[6:8] in [-1, 1] times `world.MAX_PAN_PX`) add on top, each axis clipped to
    +-`world.MAX_STEP_PX`. Returns two int64 tensors of shape (...). No host sync.
    """
    a = action.float()
    w, left, s, d, shift = a[..., 0], a[..., 1], a[..., 2], a[..., 3], a[..., 5]
    speed = world.WALK_PX * (1 + (shift > 0.5).float())
    dx = (d - left) * speed + torch.round(a[..., 6] * world.MAX_PAN_PX)
    dy = (s - w) * speed + torch.round(a[..., 7] * world.MAX_PAN_PX)
    lim = world.MAX_STEP_PX
    return torch.round(dx).clamp(-lim, lim).long(), torch.round(dy).clamp(-lim, lim).long()


class Palette(nn.Module):
    """The colours a frame is painted with: (N, P) prompt embeddings -> (N, 5, 3) frame-space colours.

    Three world colours come from the prompt (an MLP): low terrain, high terrain, object (`paint`);
    the two overlay colours (the marker, white and gold in the simulator) are learned constants. The
    last layer starts at three distinct greys, not zeros: with equal colours the height and object
    logits get no gradient.
    """

    def __init__(self, cfg: TinyWorldConfig) -> None:
        super().__init__()
        self.world = nn.Sequential(nn.Linear(cfg.prompt_dim, cfg.width), nn.SiLU(),
                                   nn.Linear(cfg.width, WORLD_COLOURS * 3))
        nn.init.zeros_(self.world[2].weight)
        with torch.no_grad():
            self.world[2].bias.copy_(torch.tensor([-0.5, 0.5, 0.0]).repeat_interleave(3))
        self.overlay = nn.Parameter(torch.tensor([[0.8, 0.8, 0.8], [0.8, 0.4, -0.4]]))

    def forward(self, prompt: torch.Tensor) -> torch.Tensor:
        n = prompt.shape[0]
        w = self.world(prompt.to(self.overlay.dtype)).view(n, WORLD_COLOURS, 3)
        return torch.cat([w, self.overlay[None].expand(n, -1, -1)], dim=1)


def paint(head: torch.Tensor, colours: torch.Tensor, overlay_bias: torch.Tensor,
          objects: torch.Tensor | None = None, height: torch.Tensor | None = None) -> torch.Tensor:
    """The picture the head's planes describe: head (N, 5, S, S), colours (N, 5, 3) -> (N, 3, S, S).

    As `world.render_view` draws: terrain = low + sigmoid(height) (high - low); the world pixel is
    terrain (1 - o) + object o; the layer logits (softmax, with overlay_bias (3, S, S): 0 where a
    layer is allowed, -1e4 where not, i.e. the overlay colours outside the marker) mix the world
    pixel with the two overlay colours.

    Args:
        objects: (N, 1, S, S) object coverage o to paint with (a draw, `draw_objects`); None: the
            head's probability sigmoid(object logit), the expected picture.
        height: (N, 1, S, S) terrain height in [0, 1] to paint with (`smooth_height`); None: the head's
            sigmoid(height logit).
    """
    lo, hi, ob = (colours[:, i, :, None, None] for i in range(WORLD_COLOURS))  # (N, 3, 1, 1)
    h = torch.sigmoid(head[:, HEIGHT:HEIGHT + 1]) if height is None else height.to(head.dtype)
    terrain = lo + h * (hi - lo)
    o = torch.sigmoid(head[:, OBJECT:OBJECT + 1]) if objects is None else objects
    pixel = torch.lerp(terrain, ob.expand_as(terrain), o)
    w = torch.softmax(head[:, LAYERS] + overlay_bias, dim=1)  # (N, 3, S, S)
    return (w[:, :1] * pixel + torch.einsum("nkhw,nkc->nchw", w[:, 1:], colours[:, WORLD_COLOURS:]))


def noise_canvas_side(frame_size: int) -> int:
    """Side of the draw noise's canvas: the view plus `DRAW_MARGIN_PX` on each side."""
    return frame_size + 2 * DRAW_MARGIN_PX


def fresh_canvas(fresh: torch.Tensor, side: int) -> torch.Tensor:
    """A canvas of fresh noise (N, DRAW_PLANES, side, side) float32 from (N, K) standard normal values:
    plane 0 takes the first side^2 values, plane 1 the values rolled by K // 2 (`carry_noise`). A 64x64
    frame's initial noise (K = 12,288) fills the canvas (side 108); a smaller frame's values repeat
    (test-sized models only)."""
    N, K = fresh.shape
    if K < side * side:  # a frame too small to fill the canvas (test-sized models): its values repeat
        fresh = fresh.repeat(1, -(-side * side // K))
        K = fresh.shape[1]
    planes = [fresh[:, :side * side], torch.roll(fresh, K // 2, dims=1)[:, :side * side]]
    return torch.stack(planes, dim=1).float().view(N, DRAW_PLANES, side, side)


def carry_noise(noise_prev: torch.Tensor, fresh: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The noise a frame's draws come from, anchored to the world: the previous frame's canvas moved by the
    camera like the picture (`warp`), fresh noise where the move brings the canvas onto positions it did not hold.

    The canvas reaches `DRAW_MARGIN_PX` beyond the view on each side, so every smooth field over the view that a
    draw reads (`noise_field`, reach <= the margin) is a function of world positions alone: a position keeps its
    noise for as long as it stays on the canvas, and a strip revealed next frame is drawn from the same field as
    its neighbour drawn this frame (a field over the view alone would wrap or pad at the edge, and each strip
    would see another field there: drawn objects came out as combs, one tooth per strip). The player marker hides
    the picture, not the world, so the canvas has no holes.

    Args:
        noise_prev: (N, DRAW_PLANES, C, C) the previous frame's canvas, C = `noise_canvas_side`, standard normal.
        fresh: (N, K) standard normal values, K >= C * C (the chunk's initial noise, flattened): plane 0 takes
            the first C * C, plane 1 the same values rolled by K // 2: a revealed strip (a few pixels wide) reads
            other values in its two planes except at the few positions that lie K // 2 apart within the strip.
        action: (N, A) the frame's actions.

    Returns:
        (N, DRAW_PLANES, C, C) in noise_prev's dtype: i.i.d. standard normal per world position and plane.
    """
    N, P, C, _ = noise_prev.shape
    new = fresh_canvas(fresh, C).flatten(2)  # (N, P, C*C)
    dx, dy = camera_shift(action)
    r = torch.arange(C, device=noise_prev.device)
    ys, xs = r[None] + dy[:, None], r[None] + dx[:, None]  # (N, C) source row / column on the previous canvas
    ok = (((ys >= 0) & (ys < C))[:, :, None] & ((xs >= 0) & (xs < C))[:, None, :]).flatten(1)  # (N, C*C)
    src = (ys.clamp(0, C - 1)[:, :, None] * C + xs.clamp(0, C - 1)[:, None, :]).flatten(1)
    moved = noise_prev.flatten(2).gather(2, src[:, None].expand(-1, P, -1))
    return torch.where(ok[:, None], moved, new.to(noise_prev.dtype)).view(N, P, C, C)


def noise_field(canvas: torch.Tensor, sigma_px: float, frame_size: int) -> torch.Tensor:
    """A smooth standard normal field over the view from one canvas plane (N, 1, C, C) -> float32 (N, 1, S, S).

    The plane blurred by a Gaussian of `sigma_px` whose kernel has unit L2 norm (so each pixel stays N(0, 1)
    exactly), evaluated only where the kernel lies on the canvas: the view's pixels. Neighbours at distance d
    correlate as exp(-d^2 / (4 sigma^2)).

    Raises:
        ValueError: the kernel reaches beyond the canvas's margin.
    """
    r = max(1, int(math.ceil(3 * sigma_px)))
    m = (canvas.shape[-1] - frame_size) // 2
    if r > m:
        raise ValueError(f"a field of sigma {sigma_px} px reaches {r} px, beyond the canvas's {m} px margin")
    x = canvas[..., m - r:m + frame_size + r, m - r:m + frame_size + r].float()
    return gaussian_blur(x, sigma_px, unit_l2=True, valid=True)


def gaussian_kernel_1d(sigma_px: float, device: torch.device, *, unit_l2: bool = False) -> torch.Tensor:
    """float32 (2r + 1,), r = ceil(3 sigma): a Gaussian kernel of unit sum, or, with `unit_l2`, of unit L2 norm
    (then its outer product with itself, the 2-D kernel, has unit L2 norm too). Eager calls build it once per
    sigma and device; a compiled step builds it in its graph, where it is a constant (Dynamo would trace through
    the cache and warn)."""
    if torch.compiler.is_compiling():
        return _gaussian_kernel_1d(sigma_px, device, unit_l2)
    return _cached_gaussian_kernel_1d(sigma_px, device, unit_l2)


def _gaussian_kernel_1d(sigma_px: float, device: torch.device, unit_l2: bool) -> torch.Tensor:
    r = max(1, int(math.ceil(3 * sigma_px)))
    k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=torch.float32, device=device) / sigma_px) ** 2)
    return k / (k.square().sum().sqrt() if unit_l2 else k.sum())


_cached_gaussian_kernel_1d = functools.lru_cache(maxsize=16)(_gaussian_kernel_1d)


def gaussian_blur(x: torch.Tensor, sigma_px: float, *, unit_l2: bool = False, valid: bool = False) -> torch.Tensor:
    """Separable Gaussian blur of float32 planes (N, 1, H, W).

    Args:
        unit_l2: a kernel of unit L2 norm (`gaussian_kernel_1d`): blurred i.i.d. N(0, 1) noise stays N(0, 1)
            per pixel; else of unit sum (a weighted mean).
        valid: only where the kernel lies on the plane: (N, 1, H - 2r, W - 2r), r = ceil(3 sigma); else
            (N, 1, H, W) with the border extended by replication (the plane is a window onto something larger).
    """
    k = gaussian_kernel_1d(sigma_px, x.device, unit_l2=unit_l2)
    if not valid:
        r = k.shape[0] // 2
        x = F.pad(x, (r, r, r, r), mode="replicate")
    return F.conv2d(F.conv2d(x, k.view(1, 1, -1, 1)), k.view(1, 1, 1, -1))


def draw_objects(object_logit: torch.Tensor, z: torch.Tensor, sigma_px: float = DRAW_SIGMA_PX) -> torch.Tensor:
    """Draw object coverage from its per-pixel probabilities with spatially correlated noise.

    A pixel is object where z < Phi^-1(p), p = sigmoid(object_logit), z a smooth standard normal field
    (`noise_field` of `sigma_px` pixels). That is a Gaussian copula: every pixel keeps its own probability
    P(z < Phi^-1(p)) = p, while neighbours draw alike, so objects come as blobs a few pixels across rather
    than salt and pepper. The edge is anti-aliased as the simulator's discs are (`world.WorldMap.generate`:
    a 1-pixel ramp): coverage ramps linearly over about one pixel of the field's slope,
    clamp((Phi^-1(p) - z) * sigma_px + 1/2, 0, 1) (the field changes by about 1 / sigma_px per pixel).

    Args:
        object_logit: (N, 1, S, S) logits of object coverage.
        z: (N, 1, S, S) float32 the field (a serving session's from its seed, anchored to the world).
        sigma_px: the field's smoothing, pixels (sets the edge's ramp).

    Returns:
        (N, 1, S, S) coverage in [0, 1] (0 or 1 away from an edge), in object_logit's dtype.
    """
    p = torch.sigmoid(object_logit.float()).clamp(1e-6, 1 - 1e-6)
    level = math.sqrt(2) * torch.erfinv(2 * p - 1)  # Phi^-1(p)
    return ((level - z.float()) * sigma_px + 0.5).clamp(0, 1).to(object_logit.dtype)


def draw_terrain(height: torch.Tensor, z: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor,
                 scale: float = TERRAIN_DRAW_SCALE) -> torch.Tensor:
    """The painted terrain height with the variation its expected continuation lacks.

    A painter that predicts the expected terrain of a revealed strip continues the known edge (the
    conditional mean of a smooth field adds no new variation), so walking extrudes the edge into bands
    along the motion and the terrain flattens. Serving adds to each pixel the increment of a smooth
    world-anchored field z between the pixel and the known pixel its strip continues (the view's edge
    in the direction the camera came from, where the warp's source index is clamped):
    h(u) + scale (z(u) - z(ref(u))). The increments telescope: along a walk the painted height follows
    scale * z's variation from where the walk began, with z's statistics (`TERRAIN_DRAW_SCALE` fits
    them to the simulator's), instead of drifting as a sum of fresh draws would. Pixels the warp can
    show have ref(u) = u (increment 0); they are copied anyway.

    Args:
        height: (N, 1, S, S) float32 height in [0, 1] (`smooth_height`).
        z: (N, 1, S, S) float32 standard normal field anchored to the world (`noise_field`).
        dx, dy: int64 (N,) the frame's camera move (`camera_shift`).
        scale: the field's size in height units.

    Returns:
        (N, 1, S, S) float32 height in [0, 1].
    """
    N, _, S, _ = z.shape
    r = torch.arange(S, device=z.device)
    # the pixel a revealed pixel continues: its source on the previous view clamped to that view, in this view
    ref_y = (r[None] + dy[:, None]).clamp(0, S - 1) - dy[:, None]  # (N, S)
    ref_x = (r[None] + dx[:, None]).clamp(0, S - 1) - dx[:, None]
    src = (ref_y[:, :, None] * S + ref_x[:, None, :]).flatten(1)  # (N, S*S)
    z_ref = z.flatten(1).gather(1, src).view_as(z)
    return (height + scale * (z - z_ref)).clamp(0, 1)


def smooth_height(height_logit: torch.Tensor, sigma_px: float = TERRAIN_SIGMA_PX) -> torch.Tensor:
    """The terrain height a serving pass paints: sigmoid(height_logit) blurred by a Gaussian of `sigma_px`.

    One pass from pure noise reads the noise where the warp cannot show a pixel, and its height keeps a
    pixel-scale grain of that noise (measured: stripes of a few levels along each revealed strip, which
    the warp then carries through the world and which more than double a world's mean |Laplacian| against
    the simulator's). The simulator's terrain has no detail that fine (`TERRAIN_SIGMA_PX`), so the height
    is smoothed before it is painted; only painted pixels change (known pixels keep the warp). The view's
    border is extended by replication, not wrapped: the view is a window, not the torus.

    Args:
        height_logit: (N, 1, S, S) the head's height logits, any float dtype.

    Returns:
        (N, 1, S, S) float32 height in [0, 1] (the weight of the high terrain colour in `paint`).
    """
    return gaussian_blur(torch.sigmoid(height_logit.float()), sigma_px)


# -----------------------------------------------------------------------------
# The pixel head


class PixelHead(nn.Module):
    """Full-resolution convolutions from per-pixel features to the planes `paint` reads.

    Input: the transformer's features unpatchified to (N, pixel_features, S, S) beside the
    frame's own inputs (N, 7, S, S) (noisy frame where unknown, warped previous frame, known mask);
    conditioning (N, D) modulates the middle layer (FiLM, zero-initialised).
    Output: (N, 5, S, S) planes for `paint`: height logit, object logit, three layer logits.
    """

    def __init__(self, cfg: TinyWorldConfig) -> None:
        super().__init__()
        w = cfg.head_width
        self.conv_in = nn.Conv2d(cfg.pixel_features + INPUT_PLANES, w, 3, 1, 1)
        self.conv_mid = nn.Conv2d(w, w, 3, 1, 1)
        self.film = nn.Linear(cfg.width, 2 * w)
        self.conv_out = nn.Conv2d(w, HEAD_PLANES, 3, 1, 1)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)
        # small random, not zero: zero logits give every colour the same weight and no gradient to split them
        nn.init.normal_(self.conv_out.weight, std=0.01)
        nn.init.zeros_(self.conv_out.bias)
        with torch.no_grad():
            self.conv_out.bias[OBJECT] = -3.0  # objects cover a few % of the world

    def forward(self, feat: torch.Tensor, planes: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv_in(torch.cat([feat, planes], dim=1)))
        scale, shift = self.film(F.silu(cond))[:, :, None, None].chunk(2, dim=1)
        h = F.gelu(_modulate(self.conv_mid(h), shift, scale))
        return self.conv_out(h)


class TinyWorldDenoiser(nn.Module):
    """Frame-causal transformer over 8x8 pixel patches predicting a frame's clean pixels.

    A frame's tokens carry its noisy pixels (where the warp cannot show them), the previous frame
    warped by the action and the known mask. The prediction keeps the warped pixels exactly where
    they are known and paints the rest from the palette, unless the frame is a cut: a prompt that
    changed the world, detected by a per-frame classifier over the pooled tokens, when everything
    is painted anew (module doc).
    """

    def __init__(self, cfg: TinyWorldConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, p = cfg.width, cfg.patch
        self.inp = nn.Linear(INPUT_PLANES * p * p, d)
        self.pos = nn.Parameter(torch.randn(1, 1, cfg.tokens_per_frame, d) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.a_mlp = nn.Sequential(nn.Linear(cfg.action_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.p_proj = nn.Sequential(nn.Linear(cfg.prompt_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.norm = nn.LayerNorm(d, elementwise_affine=False)
        self.ada_out = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, cfg.pixel_features * p * p)
        nn.init.zeros_(self.ada_out.weight)
        nn.init.zeros_(self.ada_out.bias)
        self.cut = nn.Linear(d, 1)  #: the cut classifier's logit from the frame's mean token
        nn.init.zeros_(self.cut.weight)
        nn.init.constant_(self.cut.bias, -3.0)  # cuts are rare
        self.head = PixelHead(cfg)
        self.palette = Palette(cfg)
        S = cfg.frame_size
        marker = marker_mask(S)
        self.register_buffer("marker", marker, persistent=False)
        bias = torch.zeros(1 + OVERLAY_COLOURS, S, S)
        bias[1:] = torch.where(marker, 0.0, -1e4)
        self.register_buffer("overlay_bias", bias, persistent=False)
        #: whether passes paint a sample (serving: objects drawn at flow time 1, `draw_objects`; the terrain
        #: height smoothed, `smooth_height`) or the expected picture (training)
        self.draw = False
        #: the sample's settings: two smoothings, pixels, and the object logit's offset (`DRAW_SIGMA_PX`,
        #: `TERRAIN_SIGMA_PX`, `DRAW_LOGIT_OFFSET`; the play test's tuning
        #: command varies them: `playtest.main`). Compiled steps bake them in: set them before compiling.
        self.draw_sigma_px = DRAW_SIGMA_PX
        self.terrain_sigma_px = TERRAIN_SIGMA_PX
        self.draw_logit_offset = DRAW_LOGIT_OFFSET
        self.terrain_field_sigma_px = TERRAIN_FIELD_SIGMA_PX
        self.terrain_draw_scale = TERRAIN_DRAW_SCALE
        #: the evaluation's ablation (`playtest.ABLATIONS`): None (as trained), or "constants": every painted
        #: pixel's terrain height 0.5 and object probability 0.025 instead of the network's, the drawing kept
        self.ablate: str | None = None

    # -- token layout ---------------------------------------------------------

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """Planes (N, C, S, S) -> tokens (N, T, C*p*p)."""
        p, g = self.cfg.patch, self.cfg.grid
        N, C = x.shape[:2]
        x = x.reshape(N, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(N, g * g, C * p * p)

    def unpatchify(self, x: torch.Tensor, channels: int) -> torch.Tensor:
        """Tokens (N, T, C*p*p) -> planes (N, C, S, S)."""
        p, g = self.cfg.patch, self.cfg.grid
        N = x.shape[0]
        x = x.reshape(N, g, g, channels, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(N, channels, g * p, g * p)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def colours(self, prompt: torch.Tensor) -> torch.Tensor:
        """The palette of prompt embeddings (N, P): (N, 5, 3) frame-space colours."""
        return self.palette(prompt)

    # -- forward ---------------------------------------------------------------

    def forward(
        self,
        x_t: torch.Tensor,
        prev: torch.Tensor,
        t: torch.Tensor,
        action: torch.Tensor,
        prompt: torch.Tensor,
        attend: Attend,
        *,
        kv_only: bool = False,
        predict_from: int = 0,
        draw_noise: torch.Tensor | None = None,
        recalled: torch.Tensor | None = None,
        held: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Predict clean frames of F frames and return their keys and values.

        Args:
            x_t: (B, F, 3, S, S) noisy frames at flow time t, frame space.
            prev: (B, F, 3, S, S) the previous clean frame for each frame.
            t: (B, F) flow time in [0, 1] (0 = clean, as in a commit pass).
            action: (B, F, action_dim) float32 action vectors (the action that led to each frame).
            prompt: (B, F, prompt_dim) prompt embeddings (unit norm).
            attend: the self-attention over cached keys (`DenseAttention(past_kv, bias)` offline,
                the engine's pool when serving).
            kv_only: return only the keys and values (x0 is None): a commit pass. The last
                block then computes just its K/V projection and the head is skipped.
            predict_from: predict x0 only for frames predict_from.. (a sequence whose earlier
                frames are context).
            draw_noise: (B, F, DRAW_PLANES, C, C) float32 the canvas of noise a serving pass draws from where
                `self.draw` is set (`carry_noise`, C = `noise_canvas_side`); None: a fresh canvas made of x_t.
            recalled, held: (B, F, 3, S, S) and (B, F, 1, S, S) float32 what the world memory holds of each
                frame's view and where (`memory.recall`): where the warp shows nothing and the memory holds
                the ground, the pixel is known, exactly as shown before (copied, not painted); None: no memory.

        Returns:
            x0: (B, F - predict_from, 3, S, S) predicted clean frames (None when `kv_only`), and
            per layer the (K, V) of all F frames, each (B, F*T, H, hd); all in the weights'
            dtype (inputs of any float dtype are cast to it on entry). A frame is a cut where
            its cut logit is positive.
        """
        x0, kv, _, _ = self.predict(x_t, prev, t, action, prompt, attend, kv_only=kv_only, predict_from=predict_from,
                                    draw_noise=draw_noise, recalled=recalled, held=held)
        return x0, kv

    def predict(
        self,
        x_t: torch.Tensor,
        prev: torch.Tensor,
        t: torch.Tensor,
        action: torch.Tensor,
        prompt: torch.Tensor,
        attend: Attend,
        *,
        kv_only: bool = False,
        predict_from: int = 0,
        cut: torch.Tensor | None = None,
        draw_noise: torch.Tensor | None = None,
        recalled: torch.Tensor | None = None,
        held: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None,
               torch.Tensor | None]:
        """`forward`, also returning the cut logits (B, F - predict_from) and the object logits
        (B, F - predict_from, 1, S, S) (both None when `kv_only`).

        cut: bool (B, F - predict_from) which predicted frames to treat as cuts (training passes the
        truth, so the painter learns both jobs while the classifier learns from its own loss);
        None: where the logit is positive.

        With `self.draw` set (serving), frames at flow time 1 draw their objects from the object
        probabilities with `draw_noise` (`draw_objects`) and every pass paints the smoothed terrain
        height (`smooth_height`); training paints the expected picture.
        """
        cfg = self.cfg
        B, Fr = x_t.shape[:2]
        S, T = cfg.frame_size, cfg.tokens_per_frame
        assert x_t.shape == prev.shape, f"x_t {tuple(x_t.shape)} vs prev {tuple(prev.shape)}"
        dt = self.inp.weight.dtype
        # objects are drawn from the noise as given (float32 when serving), at full precision
        if draw_noise is None and self.draw:  # nothing carried: a canvas of fresh noise from x_t itself
            fresh = x_t.float().flatten(2).flatten(0, 1)  # (B*F, 3*S*S)
            draw_noise = fresh_canvas(fresh, noise_canvas_side(S)).unflatten(0, (B, Fr))
        noise = draw_noise
        x_t, prev, action, prompt = x_t.to(dt), prev.to(dt), action.to(dt), prompt.to(dt)
        dx, dy = camera_shift(action.flatten(0, 1))
        warped, known = warp(prev.flatten(0, 1), dx, dy, self.marker)
        if held is not None and recalled is not None:  # the world memory: ground shown before, where the warp shows none
            h = held.flatten(0, 1).to(dt) * (1 - known)
            warped = warped + h * recalled.flatten(0, 1).to(dt)  # warped is 0 where unknown
            known = known + h
        # the noisy frame only where the warp cannot show the pixel: elsewhere the warp is the whole truth
        planes = torch.cat([x_t.flatten(0, 1) * (1 - known), warped, known], dim=1)  # (N, 7, S, S)
        x = self.inp(self.patchify(planes)).reshape(B, Fr, T, -1) + self.pos  # (B, F, T, D)
        cond = (
            self.t_mlp(timestep_embedding(t.flatten(), cfg.width).to(dt)).reshape(B, Fr, -1)
            + self.a_mlp(action)
            + self.p_proj(prompt)
        )  # (B, F, D)
        new_kv = []
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, cond, attend, i, kv_only=kv_only and i == last)
            new_kv.append(kv)
        if kv_only:
            return None, new_kv, None, None
        k = predict_from
        x, cond = self.norm(x[:, k:]), cond[:, k:]
        Fo = Fr - k
        cut_logit = self.cut(x.mean(2))[..., 0]  # (B, Fo)
        sh, sc = self.ada_out(F.silu(cond))[:, :, None].chunk(2, dim=-1)
        feat = self.out(_modulate(x, sh, sc))  # (B, Fo, T, pf*p*p)
        feat = self.unpatchify(feat.flatten(0, 1), cfg.pixel_features)  # (B*Fo, pf, S, S)
        sel = lambda z: z.view(B, Fr, *z.shape[1:])[:, k:].flatten(0, 1)  # noqa: E731
        planes, warped, known = sel(planes), sel(warped), sel(known)
        head = self.head(feat, planes, cond.flatten(0, 1))  # (B*Fo, 5, S, S)
        if self.ablate == "constants":  # the evaluation's ablation: the network's height and objects replaced
            head = torch.cat([torch.zeros_like(head[:, :1]),  # height sigmoid(0) = 0.5 everywhere
                              torch.full_like(head[:, :1], ABLATION_OBJECT_LOGIT), head[:, LAYERS]], dim=1)
        colours, overlay_bias = self.colours(prompt[:, k:].flatten(0, 1)), self.overlay_bias.to(dt)
        object_logit = head[:, OBJECT:OBJECT + 1]
        if self.draw:
            canvas = sel(noise.flatten(0, 1))  # (B*Fo, DRAW_PLANES, C, C)
            served_logit = object_logit + self.draw_logit_offset
            drawn = draw_objects(served_logit, noise_field(canvas[:, :1], self.draw_sigma_px, S), self.draw_sigma_px)
            first = t[:, k:].reshape(-1, 1, 1, 1) >= 1
            objects = torch.where(first, drawn, torch.sigmoid(served_logit))
            height = smooth_height(head[:, HEIGHT:HEIGHT + 1], self.terrain_sigma_px)
            z_terrain = noise_field(canvas[:, 1:2], self.terrain_field_sigma_px, S)
            drawn_height = draw_terrain(height, z_terrain, sel(dx), sel(dy), self.terrain_draw_scale)
            height = torch.where(first, drawn_height, height)
        else:
            objects = height = None
        painted = paint(head, colours, overlay_bias, objects, height)
        is_cut = (cut_logit > 0) if cut is None else cut.to(torch.bool)
        keep = (known > 0) & ~is_cut.reshape(-1, 1, 1, 1)  # (B*Fo, 1, S, S)
        x0 = torch.where(keep, warped, painted)
        return x0.view(B, Fo, cfg.channels, S, S), new_kv, cut_logit, object_logit.view(B, Fo, 1, S, S)
