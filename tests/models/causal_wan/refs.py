"""Shared helpers of the causal Wan parity tests: references built from diffusers, same random weights.

The references are diffusers 0.42.1's modules (a test-only dependency). They compute
their norms, adaLN modulation, residual stream and RoPE tables through `.float()`
casts (their bf16 numerics), so run in float64 they are only float32-accurate.
`lifted_fp32_casts()` makes `.float()` leave float64 tensors alone while a reference
is built and run, which turns those islands into float64 without touching their
code; tests state which mode they compare against and the tolerance that follows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from worldcast.models.causal_wan.config import CausalWanConfig
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.loading import diffusers_to_original, load_state_strict

_FLOAT = torch.Tensor.float


@contextlib.contextmanager
def lifted_fp32_casts() -> Iterator[None]:
    """While active, `Tensor.float()` returns float64 tensors unchanged (other dtypes as usual)."""

    def _float(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self if self.dtype == torch.float64 else _FLOAT(self, *args, **kwargs)

    torch.Tensor.float = _float  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.float = _FLOAT  # type: ignore[method-assign]


def randomize_(module: torch.nn.Module, *, seed: int, scale: float = 0.3) -> None:
    """Overwrite every parameter (norm gains included) with seeded N(0, scale^2) values, in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * scale)


def diffusers_dit_kwargs(cfg: CausalWanConfig) -> dict:
    """WanTransformer3DModel / SkyReelsV2Transformer3DModel constructor arguments for `cfg`'s network."""
    return dict(
        patch_size=cfg.patch, num_attention_heads=cfg.heads, attention_head_dim=cfg.head_dim,
        in_channels=cfg.in_channels, out_channels=cfg.out_channels, text_dim=cfg.text_dim, freq_dim=cfg.freq_dim,
        ffn_dim=cfg.ffn_dim, num_layers=cfg.layers, cross_attn_norm=cfg.cross_attn_norm,
        qk_norm="rms_norm_across_heads" if cfg.qk_norm else None, eps=cfg.eps,
    )  # fmt: skip


def ours_from(ref: torch.nn.Module, cfg: CausalWanConfig) -> CausalWanDiT:
    """Our DiT in float64 with the reference's weights, through loading.DIT_KEY_TABLE."""
    dit = CausalWanDiT(cfg).double()
    load_state_strict(dit, {diffusers_to_original(k): v for k, v in ref.state_dict().items()}, what="reference")
    return dit.eval()


def wan_reference(cfg: CausalWanConfig, *, seed: int, lifted: bool) -> torch.nn.Module:
    """diffusers WanTransformer3DModel in float64 with seeded random weights.

    With `lifted`, it is built under `lifted_fp32_casts` (its RoPE tables stay float64) and its
    float32 timestep sinusoid (`Timesteps`) is swapped for diffusers' float64 one of the same
    formula (`SkyReelsV2Timesteps`: [cos | sin] of t * 10000^(-i/(d/2))).
    """
    from diffusers import WanTransformer3DModel
    from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2Timesteps

    ctx = lifted_fp32_casts() if lifted else contextlib.nullcontext()
    with ctx:
        ref = WanTransformer3DModel(**diffusers_dit_kwargs(cfg)).double().eval()
    if lifted:
        ref.condition_embedder.timesteps_proj = SkyReelsV2Timesteps(cfg.freq_dim, flip_sin_to_cos=True)
    randomize_(ref, seed=seed)
    return ref


def skyreels_reference(cfg: CausalWanConfig, *, seed: int, frames_per_block: int) -> torch.nn.Module:
    """diffusers SkyReelsV2Transformer3DModel (block-causal when frames_per_block > 1), float64, built lifted."""
    from diffusers import SkyReelsV2Transformer3DModel

    with lifted_fp32_casts():
        ref = SkyReelsV2Transformer3DModel(**diffusers_dit_kwargs(cfg), num_frame_per_block=frames_per_block)
    ref = ref.double().eval()
    randomize_(ref, seed=seed)
    return ref


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())
