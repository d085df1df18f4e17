"""The causal Wan family's checkpoint chain for the GPU check: random checkpoints in the published layouts,
loaded as a user loads them.

`checkpoint_models` writes random 1.3B checkpoints (tiny ones with `smoke`) in the layouts users bring
(Self-Forcing's `.pt` with `generator_ema`, LongLive's base + rank-256 LoRA, Wan 2.1's release folder
with its VAE and a one-layer umT5 of the XXL width; `fullsize.write_layouts`), then loads each through
`factory.load` (preset chosen from the file name, EMA, LoRA merged) and hands the model to the engine's
device check (`latency_bench/gpu_check/engine.py`, the opt-in part `checkpoint_chains` of
`make gpu-check`), which times its served path. Registered as the family's
`checkpoint_check` (`family.py`), so the engine never names the family.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import torch

from worldcast.models.base import WorldModel
from worldcast.models.registry import LoadRequest

#: latent frames Self-Forcing was trained on: its long session is run past this horizon
HORIZON_FRAMES = 21


def checkpoint_models(device: str, *, smoke: bool, workdir: Path) -> Iterator[tuple[str, WorldModel, dict]]:  # type: ignore[type-arg]
    """Yield (label, model, info) for the longlive and self-forcing layouts, loaded from generated files.

    `info` holds the load time, the model's `source` line and, for self-forcing, `long_session` (run one
    session past `horizon_frames`). Files live under `workdir` (the caller removes it).
    """
    from worldcast.models.causal_wan import factory, fullsize
    from worldcast.models.causal_wan.config import WanVAEConfig, tiny, wan_1_3b

    if smoke:
        cfg = tiny(vae=WanVAEConfig(base_dim=4, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                                    latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4))
        dtype = torch.float32
    else:
        cfg, dtype = wan_1_3b(), torch.bfloat16
    paths = fullsize.write_layouts(workdir, cfg, dtype=dtype, text_layers=1,
                                   layouts=frozenset({"wan", "self-forcing", "longlive"}))
    wan = paths["wan 2.1 release folder"]
    for preset, key in (("longlive", "longlive base .pt + lora.pt"),
                        ("self-forcing", "self-forcing .pt (generator + generator_ema)")):
        t0 = time.perf_counter()
        model = factory.load(LoadRequest(variant="1.3b", weights=paths[key], device=device, options=MappingProxyType(
            {"wan_base": wan, "wan_size": "64x64" if smoke else None})))
        info = {"source": model.source, "load_s": time.perf_counter() - t0,
                "decode_latent_frames_per_pass": model.decode_frames_per_call}
        if preset == "self-forcing":
            info |= {"long_session": True, "horizon_frames": HORIZON_FRAMES}
        yield preset, model, info
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
