"""Shared helpers of the Matrix-Game encoder tests: the tiny configs, diffusers' VAE as a reference, the fixture."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.models.causal_wan.refs import randomize_
from worldcast.models.matrix_game.image_encoder import ClipVisionConfig
from worldcast.models.matrix_game.vae_encoder import tiny_vae_config

DATA = Path(__file__).with_name("data")
MEAN = tuple(0.1 * i - 0.7 for i in range(16))  #: per-channel latent stats that are not 0 / 1
STD = tuple(0.5 + 0.1 * i for i in range(16))
VAE_CFG = tiny_vae_config(latents_mean=MEAN, latents_std=STD)


def diffusers_vae(*, seed: int = 31) -> torch.nn.Module:
    """diffusers AutoencoderKLWan at VAE_CFG's sizes, float64, seeded N(0, 0.3^2) weights."""
    from diffusers import AutoencoderKLWan

    c = VAE_CFG
    ref = AutoencoderKLWan(
        base_dim=c.base_dim, z_dim=c.z_dim, dim_mult=list(c.dim_mult), num_res_blocks=c.num_res_blocks,
        attn_scales=[], temperal_downsample=list(c.temporal_downsample),
        latents_mean=list(MEAN), latents_std=list(STD),
    ).double().eval()  # fmt: skip
    randomize_(ref, seed=seed, scale=0.3)
    return ref


def diffusers_encode(ref: torch.nn.Module, video: torch.Tensor) -> torch.Tensor:
    """The Wan i2v pipelines' way: the posterior's mode, (x - mean) / std per channel."""
    with torch.no_grad():
        mu = ref.encode(video).latent_dist.mode()
    mean = torch.tensor(MEAN, dtype=mu.dtype).view(1, -1, 1, 1, 1)
    std = torch.tensor(STD, dtype=mu.dtype).view(1, -1, 1, 1, 1)
    return (mu - mean) / std


def fixture() -> tuple[dict[str, torch.Tensor], dict]:
    """The committed release fixture (regen_encoder_fixtures.py): tensors and metadata."""
    return load_file(str(DATA / "encoders.safetensors")), json.loads((DATA / "encoders.json").read_text())


def fixture_clip_config(meta: dict) -> ClipVisionConfig:
    c = meta["clip"]["config"]
    w = c["vision_dim"]
    return ClipVisionConfig(
        width=w, layers=c["vision_layers"], heads=c["vision_heads"], mlp_dim=w * c["vision_mlp_ratio"]
    )


def substate(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())
