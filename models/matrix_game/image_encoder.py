"""The CLIP vision encoder of Matrix-Game 2.0 (Wan 2.1 i2v): 257 tokens of its penultimate layer.

The release ships the vision tower of OpenCLIP's XLM-RoBERTa-large ViT-H/14
(`models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`): width 1280, 32 pre-norm layers,
16 heads, exact GELU, a pre-LayerNorm after the embeddings, patch 14 at 224x224 (16 x 16
patches + the class token = 257 tokens). Matrix-Game and Wan i2v take the hidden states
after layer 31 of 32 (`use_31_block=True`; diffusers' Wan i2v takes `hidden_states[-2]`),
without the final LayerNorm. That is transformers' `CLIPVisionModel` built with 31 layers:
its `last_hidden_state` is the output of its last layer, before `post_layernorm` (which only
touches the pooled class token). `loading_encoders.py` maps the release's key names onto it.

Preprocessing (release `CLIPModel.encode_video`; FastVideo `MatrixGame2ImageEncodingStage`):
the first frame in [-1, 1] at the model's geometry, resized to 224x224 by bicubic
interpolation (align_corners=False, no antialiasing), mapped to [0, 1], then normalised with
OpenAI CLIP's mean and std.

Sources read: Matrix-Game 2.0 `Matrix-Game-2/wan/vae/wanx_vae_src/clip.py`
(`VisionTransformer`, `clip_xlm_roberta_vit_h_14`, `CLIPModel.encode_video`); transformers
5 `models/clip/modeling_clip.py` (`CLIPVisionModel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.models.causal_wan.dit import acc_dtype

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  #: OpenAI CLIP pixel mean (release clip.py `_clip`)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)  #: OpenAI CLIP pixel std


@dataclass(frozen=True)
class ClipVisionConfig:
    """The vision tower (release `clip_xlm_roberta_vit_h_14` defaults; transformers names in brackets)."""

    width: int = 1280  #: token features [hidden_size]
    layers: int = 32  #: transformer layers of the released tower [num_hidden_layers]
    heads: int = 16  #: attention heads [num_attention_heads]
    mlp_dim: int = 5120  #: MLP hidden width, 4 x width [intermediate_size]
    image_size: int = 224  #: square input side in pixels [image_size]
    patch_size: int = 14  #: patch side in pixels [patch_size]
    eps: float = 1e-5  #: LayerNorm epsilon [layer_norm_eps]
    feature_layer: int = -2  #: hidden state used, counted from the end: -2 = after layer 31 of 32

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must divide by heads {self.heads}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} must divide by patch_size {self.patch_size}")
        if not -self.layers <= self.feature_layer <= -1:
            raise ValueError(f"feature_layer must be in [-{self.layers}, -1], got {self.feature_layer}")

    @property
    def tokens(self) -> int:
        """Output tokens per image: the patches plus the class token (257 at 224 / 14)."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def run_layers(self) -> int:
        """Layers actually run (the ones after the feature layer are never used): 31 of 32."""
        return self.layers + 1 + self.feature_layer

    def to_transformers(self):  # type: ignore[no-untyped-def]
        """The `transformers.CLIPVisionConfig` of the truncated tower (`run_layers` layers)."""
        from transformers import CLIPVisionConfig

        return CLIPVisionConfig(
            hidden_size=self.width, intermediate_size=self.mlp_dim, num_hidden_layers=self.run_layers,
            num_attention_heads=self.heads, image_size=self.image_size, patch_size=self.patch_size,
            hidden_act="gelu", layer_norm_eps=self.eps, num_channels=3,
        )  # fmt: skip


def tiny_clip_config(**overrides: object) -> ClipVisionConfig:
    """A narrow tower at the real input geometry (224 / 14: 257 tokens) for CPU tests and the tiny variant."""
    kw: dict[str, object] = dict(width=32, layers=3, heads=2, mlp_dim=128)
    kw.update(overrides)
    return ClipVisionConfig(**kw)  # type: ignore[arg-type]


def clip_pixels(image: torch.Tensor, size: int) -> torch.Tensor:
    """The release's CLIP preprocessing: (B, 3, H, W) in [-1, 1] -> (B, 3, size, size) normalised.

    Bicubic resize (align_corners=False, no antialias), [-1, 1] -> [0, 1], then
    (x - CLIP_MEAN) / CLIP_STD. Same dtype as the input (floating).
    """
    if image.dim() != 4 or image.shape[1] != 3:
        raise ValueError(f"image must be (B, 3, H, W), got shape {tuple(image.shape)}")
    x = F.interpolate(image, size=(size, size), mode="bicubic", align_corners=False)
    x = x * 0.5 + 0.5
    mean = torch.tensor(CLIP_MEAN, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


class ClipImageEncoder(nn.Module):
    """Image -> CLIP tokens, (B, 3, H, W) in [-1, 1] -> (B, 257, 1280): what the DiT's image MLP takes.

    `model` is a transformers `CLIPVisionModel` of `cfg.run_layers` layers (its state-dict
    names, without a `vision_model.` prefix, are what `loading_encoders` fills).
    """

    def __init__(self, cfg: ClipVisionConfig, *, init_weights: bool = True) -> None:
        """`init_weights=False` leaves the parameters uninitialised (for a loader that fills them all:
        the full tower's random init takes most of a minute on a small CPU)."""
        super().__init__()
        import contextlib

        from transformers import CLIPVisionModel
        from transformers.initialization import no_init_weights

        self.cfg = cfg
        with contextlib.nullcontext() if init_weights else no_init_weights():
            self.model = CLIPVisionModel(cfg.to_transformers()).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embeddings.patch_embedding.weight.dtype

    @torch.no_grad()
    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Encode first frames.

        Args:
            image: (B, 3, H, W) RGB in [-1, 1], any float dtype and size (resized to 224 here).

        Returns:
            (B, cfg.tokens, cfg.width) hidden states of layer `cfg.run_layers`, in the encoder's dtype.

        Raises:
            ValueError: not (B, 3, H, W).
        """
        px = clip_pixels(image.to(acc_dtype(self.dtype)), self.cfg.image_size).to(self.dtype)
        return self.model(pixel_values=px).last_hidden_state  # (B, 257, width)
