"""CausalWanConfig: the warped timesteps, geometry, presets and validation."""

from __future__ import annotations

import pytest
import torch

from worldcast.models.causal_wan.config import CausalWanConfig, longlive_1_3b, tiny, wan_1_3b, warped_timesteps
from worldcast.models.causal_wan.dit import CausalWanDiT


def test_self_forcing_warped_timesteps() -> None:
    got = warped_timesteps((1000, 750, 500, 250), 5.0)
    assert got[0] == 1000.0 and got[1] == 937.5 and got[3] == 625.0
    assert got[2] == pytest.approx(2500 / 3, abs=1e-9)
    assert wan_1_3b().timesteps == got
    assert wan_1_3b().flow_times == pytest.approx((1.0, 0.9375, 0.8333333333, 0.625))
    # unwarped and other shifts: the step list itself, and CausVid's shift 8
    assert wan_1_3b(warp_denoising_step=False).timesteps == (1000.0, 750.0, 500.0, 250.0)
    assert warped_timesteps((0, 1000), 8.0) == (0.0, 1000.0)
    with pytest.raises(ValueError, match="outside"):
        warped_timesteps((1001,), 5.0)


def test_geometry_of_the_presets() -> None:
    cfg = wan_1_3b()
    assert (cfg.dim, cfg.heads, cfg.head_dim, cfg.layers, cfg.ffn_dim) == (1536, 12, 128, 30, 8960)
    assert cfg.rope_dims == (44, 42, 42)
    assert cfg.tokens_per_frame(480, 832) == 1560 and cfg.latent_size(480, 832) == (60, 104)
    assert cfg.pixel_frames(3, first_chunk=True) == 9 and cfg.pixel_frames(3, first_chunk=False) == 12
    assert longlive_1_3b().kv_cache_frames == 9  # 3 sinks + 6 recent; the chunk brings its own 3
    assert longlive_1_3b().kv_recent_frames == 6
    with pytest.raises(ValueError, match="global"):
        _ = cfg.kv_cache_frames
    assert tiny().tokens_per_frame(64, 64) == 16


def test_full_size_parameter_count() -> None:
    """1.419 B parameters, 46.44 M per block, as diffusers counts Wan 2.1 1.3B (built on the meta device)."""
    with torch.device("meta"):
        dit = CausalWanDiT(wan_1_3b())
    assert round(dit.num_params() / 1e9, 3) == 1.419
    assert round(sum(p.numel() for p in dit.blocks[0].parameters()) / 1e6, 2) == 46.44


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"heads": 5}, "divide"),
        ({"local_attn_size": 4, "sink_size": 3}, "local_attn_size"),
        ({"sink_size": -1}, "sink_size"),
        ({"frame_height": 100}, "frame size"),
        ({"out_channels": 8}, "z_dim"),
        ({"denoising_steps": (2000,)}, "outside"),
    ],
)
def test_bad_configs_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CausalWanConfig(**kw)
