"""CausalWanConfig: the references' schedule table, geometry, presets and validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worldcast.models.causal_wan.config import CausalWanConfig, longlive_1_3b, tiny, wan_1_3b
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.presets import PRESETS, PresetError, resolve_preset
from worldcast.models.causal_wan.schedule import FlowSchedule


def test_self_forcing_warped_timesteps_are_the_float32_table_entries() -> None:
    """Self-Forcing indexes its float32 shift-5 table at 1000 - step: 833.33331298828125, not 2500/3."""
    cfg = PRESETS["self-forcing"].config()
    assert cfg.timesteps == (1000.0, 937.5, float(torch.tensor(2500 / 3, dtype=torch.float32)), 625.0)
    assert cfg.timesteps[2] != 2500 / 3  # the float32 table, as the reference computes it
    assert cfg.flow_times == (1.0, 0.9375, float(torch.tensor(5 / 6, dtype=torch.float32)), 0.625)
    assert cfg.timestep_of(cfg.flow_times[2]) == cfg.timesteps[2] and cfg.timestep_of(0.0) == 0.0
    with pytest.raises(ValueError, match="not a step"):
        cfg.timestep_of(0.5)


def test_causvid_steps_are_embedded_as_integers_and_denoised_at_the_nearest_table_sigma() -> None:
    cfg = PRESETS["causvid"].config()
    assert cfg.timesteps == (1000.0, 757.0, 522.0)
    sig = cfg.flow_times
    assert sig[0] == 1.0 and sig[1] != 0.757 and abs(sig[1] - 0.757) < 1e-3 and abs(sig[2] - 0.522) < 1e-3
    sigmas, ts = FlowSchedule((1000, 757, 522), 8.0, False).table  # nearest entry of the shift-8 table
    assert sig[1] == float(sigmas[int((ts - 757).abs().argmin())])
    with pytest.raises(ValueError, match="outside"):
        FlowSchedule((1001,), 5.0, True)
    with pytest.raises(ValueError, match="descending"):
        FlowSchedule((500, 750), 5.0, True)


def test_presets_cite_their_source_and_resolve_from_published_file_names() -> None:
    sf, cv, ll = PRESETS["self-forcing"], PRESETS["causvid"], PRESETS["longlive"]
    assert (sf.config().local_attn_size, sf.config().sink_size, sf.ema) == (21, 0, True)
    cvc = cv.config()
    assert (cvc.local_attn_size, cvc.timestep_shift, cvc.warp_denoising_step) == (21, 8.0, False)
    assert (ll.config().local_attn_size, ll.config().sink_size, ll.lora_alpha_over_rank) == (12, 3, 1.0)
    assert all("@" in p.source and ".yaml" in p.source for p in PRESETS.values())
    assert resolve_preset("auto", Path("ckpt/self_forcing_dmd.pt"))[0] is sf
    assert resolve_preset("auto", Path("CausVid/autoregressive_checkpoint/model.pt"))[0] is cv
    assert resolve_preset("auto", Path("longlive_models/models/longlive_base.pt"))[0] is ll
    assert resolve_preset("longlive-1.3b", None)[0] is ll  # the old name
    with pytest.raises(PresetError, match="--wan-preset"):
        resolve_preset("auto", Path("/models/my_model.pt"))
    with pytest.raises(PresetError, match="unknown"):
        resolve_preset("self_forcing", None)


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
