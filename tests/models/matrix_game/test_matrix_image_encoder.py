"""The CLIP vision encoder against transformers' own CLIPVisionModel (fp64, same tiny weights)."""

from __future__ import annotations

import pytest
import torch

from tests.models.causal_wan.refs import randomize_
from tests.models.matrix_game.enc_refs import max_err
from worldcast.models.matrix_game.image_encoder import (
    CLIP_MEAN,
    CLIP_STD,
    ClipImageEncoder,
    ClipVisionConfig,
    clip_pixels,
    tiny_clip_config,
)


def _pair(cfg: ClipVisionConfig) -> tuple[torch.nn.Module, ClipImageEncoder]:
    """transformers CLIPVisionModel with all `cfg.layers` layers, and ours (truncated) with its weights."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    full = CLIPVisionConfig(
        hidden_size=cfg.width, intermediate_size=cfg.mlp_dim, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, image_size=cfg.image_size, patch_size=cfg.patch_size,
        hidden_act="gelu", layer_norm_eps=cfg.eps,
    )  # fmt: skip
    ref = CLIPVisionModel(full).double().eval()
    randomize_(ref, seed=41, scale=0.2)
    ours = ClipImageEncoder(cfg).double()
    state = ref.state_dict()
    ours.model.load_state_dict({k: state[k] for k in ours.model.state_dict()}, strict=True)
    return ref, ours


def test_matrix_clip_equals_transformers_penultimate_layer() -> None:
    """Parity: 257 tokens of hidden_states[-2] (Wan i2v's choice), from a 352x640 image in [-1, 1]."""
    cfg = tiny_clip_config()
    ref, ours = _pair(cfg)
    img = torch.rand(2, 3, 352, 640, generator=torch.Generator().manual_seed(42), dtype=torch.float64) * 2 - 1
    got = ours(img)
    with torch.no_grad():
        hs = ref(pixel_values=clip_pixels(img, 224), output_hidden_states=True).hidden_states
    assert got.shape == (2, 257, cfg.width) and len(hs) == cfg.layers + 1
    err = max_err(got, hs[-2])
    assert err <= 1e-12, f"max abs err {err:.3g} > 1e-12 vs CLIPVisionModel hidden_states[-2]"
    assert max_err(got, hs[-1]) > 1e-3, "control: the last layer's output must differ"


def test_matrix_clip_full_size_geometry() -> None:
    """The released tower: 31 of 32 layers run, 257 x 1280 features."""
    cfg = ClipVisionConfig()
    assert (cfg.tokens, cfg.width, cfg.run_layers) == (257, 1280, 31)
    with torch.device("meta"):
        enc = ClipImageEncoder(cfg)
    assert len(enc.model.encoder.layers) == 31
    assert 610e6 < sum(p.numel() for p in enc.parameters()) < 612e6  # ViT-H/14 less its last layer (19.7 M)


def test_matrix_clip_pixels_normalise_with_clip_stats() -> None:
    """A constant image c in [-1, 1] becomes ((c + 1) / 2 - mean) / std per channel, at 224 x 224."""
    img = torch.full((1, 3, 352, 640), 0.2, dtype=torch.float64)
    px = clip_pixels(img, 224)
    assert px.shape == (1, 3, 224, 224)
    want = (0.6 - torch.tensor(CLIP_MEAN, dtype=torch.float64)) / torch.tensor(CLIP_STD, dtype=torch.float64)
    assert max_err(px.mean(dim=(2, 3))[0], want) <= 1e-12 and float(px.std(dim=(2, 3)).max()) < 1e-12


def test_matrix_clip_config_is_checked() -> None:
    with pytest.raises(ValueError, match="feature_layer"):
        ClipVisionConfig(feature_layer=0)
    with pytest.raises(ValueError, match="divide by heads"):
        ClipVisionConfig(width=30, heads=4)
    with pytest.raises(ValueError, match="B, 3, H, W"):
        clip_pixels(torch.zeros(3, 8, 8), 224)
