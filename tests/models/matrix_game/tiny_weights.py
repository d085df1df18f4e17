"""Seeded tiny weights and configs shared by the fixture script (run beside the reference) and the tests.

The fixtures store no weights: both sides regenerate them from the release's key names and
shapes (kept in the fixture's metadata) with `seeded_state`, so a fixture is inputs and outputs only.
"""

from __future__ import annotations

import zlib

import torch

#: the fixtures' configs, in the release's `config.json` layout (what `make_fixtures.py` builds the
#: reference from and the tests read back through `MatrixGameConfig.from_release`)
FIXTURE_CONFIGS: dict[str, dict] = {
    # universal's layout: keyboard 4 + mouse 2, window 6 (3 committed frames), 3 steps
    "universal": {
        "_class_name": "CausalWanModel", "model_type": "i2v", "dim": 32, "ffn_dim": 64, "freq_dim": 32,
        "in_dim": 36, "out_dim": 16, "num_heads": 2, "num_layers": 3, "eps": 1e-6, "text_len": 512,
        "local_attn_size": 6, "sink_size": 0, "inject_sample_info": False,
        "action_config": {
            "blocks": [0, 1], "enable_keyboard": True, "enable_mouse": True, "heads_num": 2, "hidden_size": 16,
            "img_hidden_size": 32, "keyboard_dim_in": 4, "keyboard_hidden_dim": 128, "mouse_dim_in": 2,
            "mouse_hidden_dim": 128, "mouse_qk_dim_list": [8, 28, 28], "patch_size": [1, 2, 2], "qk_norm": True,
            "qkv_bias": False, "rope_dim_list": [8, 28, 28], "rope_theta": 256, "vae_time_compression_ratio": 4,
            "windows_size": 3,
        },
    },
    # templerun's layout: keyboard 7, no mouse, 4 steps; GTA's window 4 (1 committed frame)
    "keyboard_only": {
        "_class_name": "CausalWanModel", "model_type": "i2v", "dim": 32, "ffn_dim": 64, "freq_dim": 32,
        "in_dim": 36, "out_dim": 16, "num_heads": 2, "num_layers": 3, "eps": 1e-6, "text_len": 512,
        "local_attn_size": 4, "sink_size": 0, "inject_sample_info": False,
        "action_config": {
            "blocks": [0, 2], "enable_keyboard": True, "enable_mouse": False, "heads_num": 2, "hidden_size": 16,
            "img_hidden_size": 32, "keyboard_dim_in": 7, "keyboard_hidden_dim": 128, "patch_size": [1, 2, 2],
            "qk_norm": True, "qkv_bias": False, "rope_dim_list": [8, 28, 28], "rope_theta": 256,
            "vae_time_compression_ratio": 4, "windows_size": 3,
        },
    },
}

#: per fixture: inference settings (the release's inference yaml keys), rollout size and seeds
FIXTURE_RUNS: dict[str, dict] = {
    "universal": {"denoising_step_list": [1000, 666, 333], "warp_denoising_step": True, "num_frame_per_block": 3,
                  "context_noise": 0, "model_kwargs": {"timestep_shift": 5.0}, "latent_frames": 12,
                  "latent_hw": [4, 6], "image_tokens": 5, "cond_latent_frames": 5, "weight_seed": 17,
                  "input_seed": 23},
    "keyboard_only": {"denoising_step_list": [1000, 750, 500, 250], "warp_denoising_step": True,
                      "num_frame_per_block": 3, "context_noise": 0, "model_kwargs": {"timestep_shift": 5.0},
                      "latent_frames": 9, "latent_hw": [4, 6], "image_tokens": 5, "cond_latent_frames": 4,
                      "weight_seed": 29, "input_seed": 31},
}


def seeded_state(shapes: dict[str, tuple[int, ...]], *, seed: int, dtype: torch.dtype = torch.float64
                 ) -> dict[str, torch.Tensor]:
    """Weights for every key: N(0, 1/fan_in) matrices, N(0, 0.3^2) vectors; norm gains 1 + N(0, 0.2^2).

    Each key draws from its own generator (seed + crc32(key)), so the values do not depend on
    the order keys are listed in. Keys are the release's (with its `model.` prefix).
    """
    out = {}
    for key, shape in shapes.items():
        g = torch.Generator().manual_seed(seed + zlib.crc32(key.encode()))
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        is_norm = any(s in key for s in ("norm", "img_emb.proj.0.", "img_emb.proj.4.", "mouse_mlp.3."))
        if is_norm and key.endswith("weight"):
            x = 1.0 + 0.2 * x
        elif len(shape) >= 2 and "modulation" not in key:
            fan_in = 1
            for d in shape[1:]:
                fan_in *= d
            x = x * fan_in ** -0.5
        else:
            x = 0.3 * x
        out[key] = x.to(dtype)
    return out
