"""Parity with the families' own code: our modules and presets against fixtures their code produced.

The fixtures (`fixtures/*.safetensors` + `.json`, each naming the reference's commit) were written by
`make_reference_fixtures.py` running Self-Forcing's, CausVid's and LongLive 1.0's own pipelines, and
Wan 2.1's own VAE decoder and umT5 encoder, on seeded tiny float64 weights (what it stubbed is listed
in each JSON). Here the same weights go through our loaders (the `.pt` layout, the LoRA merge, Wan's
own file names) into our float64 modules, driven by our presets' settings and the recorded noise.
Each test has a control that must differ, so it can fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.models.causal_wan.refs import max_err
from worldcast.models.causal_wan.checkpoints import load_state_strict, original_dit_state
from worldcast.models.causal_wan.config import CausalWanConfig, WanVAEConfig
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.keys import wan_t5_to_transformers, wan_vae_to_diffusers
from worldcast.models.causal_wan.loading import build_dit
from worldcast.models.causal_wan.lora import merge_lora
from worldcast.models.causal_wan.presets import PRESETS
from worldcast.models.causal_wan.recache import recache_dense
from worldcast.models.causal_wan.sampler import generate_chunk
from worldcast.models.causal_wan.text import umt5_from_wan_state
from worldcast.models.causal_wan.vae import WanVAEDecoder

FIXTURES = Path(__file__).parent / "fixtures"
TOL = 1e-11  # float64 end to end; measured errors are printed in the assertion messages


def fixture(name: str) -> tuple[dict[str, torch.Tensor], dict]:
    return load_file(str(FIXTURES / f"{name}.safetensors")), json.loads((FIXTURES / f"{name}.json").read_text())


def prefixed(t: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}


def our_config(meta: dict, **overrides: object) -> CausalWanConfig:
    """The fixture's preset with its tiny network."""
    net, (c, h, w) = meta["net"], meta["latent"]
    return PRESETS[meta["preset"]].config(
        dim=net["dim"], ffn_dim=net["ffn_dim"], freq_dim=net["freq_dim"], text_dim=net["text_dim"],
        heads=net["num_heads"], layers=net["num_layers"], in_channels=net["in_dim"], out_channels=net["out_dim"],
        text_len=net["text_len"], frame_height=8 * h, frame_width=8 * w,
        vae=WanVAEConfig(base_dim=4, z_dim=c, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                         latents_mean=(0.0,) * c, latents_std=(1.0,) * c), **overrides)  # fmt: skip


def our_dit(t: dict[str, torch.Tensor], cfg: CausalWanConfig, *, lora_alpha: float | None = None) -> CausalWanDiT:
    """The fixture's weights through our `.pt` reader (Self-Forcing's layout) and, if any, the LoRA merge."""
    ckpt = {"generator": {f"model.{k}": v for k, v in prefixed(t, "weights.").items()}}
    state = original_dit_state(ckpt)
    if lora := prefixed(t, "lora."):
        state = merge_lora(state, lora, alpha=lora_alpha)
    return build_dit(cfg, state, dtype=torch.float64, device="cpu", what="fixture")


def rollout(t: dict[str, torch.Tensor], meta: dict, dit: CausalWanDiT, *, switches: tuple[int, ...] = (),
            recache: bool = True) -> list[torch.Tensor]:
    """Our reference loop over the fixture's chunks: the recorded initial noise and fresh-noise draws,
    a prompt switch (new cross-attention cache + `recache_dense`) at each of `switches`."""
    cfg = dit.cfg
    Fc, (C, h, w) = meta["frames_per_chunk"], meta["latent"]
    noise = t["noise"]
    draws: Iterator[torch.Tensor] = iter(t["draws"])

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        return next(draws).view(1, Fc, C, h, w).permute(0, 2, 1, 3, 4)

    attn = DenseSelfAttention(cfg, 1)
    seg = 0
    cross = dit.cross_kv(t["context.0"])
    latents: dict[int, torch.Tensor] = {}
    out = []
    for c in range(meta["chunks"]):
        c0 = c * Fc
        if c0 in switches:
            seg += 1
            cross = dit.cross_kv(t[f"context.{seg}"])
            if recache:
                recache_dense(dit, attn, latents, cross, c0)
        x = noise[:, c0:c0 + Fc].permute(0, 2, 1, 3, 4)
        x0, _ = generate_chunk(dit, x, cross, attn, torch.tensor([c0]), noise_fn=draw)
        for f in range(Fc):
            latents[c0 + f] = x0[0, :, f]
        out.append(x0.permute(0, 2, 1, 3, 4))
    assert next(draws, None) is None, "every recorded draw is used"
    return out


def chunk_errors(ours: list[torch.Tensor], want: torch.Tensor, Fc: int) -> list[float]:
    return [max_err(o, want[:, i * Fc:(i + 1) * Fc]) for i, o in enumerate(ours)]


@pytest.mark.parametrize("name", ["self_forcing", "self_forcing_rolling", "causvid"])
def test_self_forcing_and_causvid_presets_compute_what_their_own_pipelines_compute(name: str) -> None:
    """7 chunks of global attention over the 21-frame horizon (Self-Forcing, CausVid), and Self-Forcing's
    own rolling cache past it (local_attn_size 21, sink 0: 10 chunks) = our preset's window rule."""
    t, meta = fixture(name)
    cfg = our_config(meta)
    assert cfg.timesteps == tuple(meta["denoising_step_list"]), "the preset's timesteps are the reference's"
    errs = chunk_errors(rollout(t, meta, our_dit(t, cfg)), t["output"], meta["frames_per_chunk"])
    assert max(errs) <= TOL, f"{name} ({meta['commit'][:7]}): per-chunk max abs err {errs} > {TOL}"
    # control: the same steps under another table shift (another noise level per step) must differ
    wrong = rollout(t, meta, our_dit(t, our_config(meta, timestep_shift=3.0)))
    assert max(chunk_errors(wrong, t["output"], meta["frames_per_chunk"])) > 1e-3


def test_self_forcing_rolling_window_past_the_horizon_differs_from_sinks() -> None:
    """Past frame 21 the rolling window matters: 3 sinks (LongLive's rule) on the same weights differ."""
    t, meta = fixture("self_forcing_rolling")
    sinks = our_config(meta, sink_size=3)
    errs = chunk_errors(rollout(t, meta, our_dit(t, sinks)), t["output"], meta["frames_per_chunk"])
    assert max(errs[:7]) <= TOL, "within the horizon a sink is just another visible frame"
    assert min(errs[7:]) > 1e-6, f"past the horizon sinks must change the result: {errs}"


def test_longlive_preset_with_its_lora_and_recache_computes_what_longlive_computes() -> None:
    """10 chunks, window 12 with 3 sinks, the LoRA merged (alpha / r from the fixture), prompt switches at
    frames 6 (within the first window: sinks re-run) and 21 (steady state: sinks kept)."""
    t, meta = fixture("longlive")
    cfg = our_config(meta)
    dit = our_dit(t, cfg, lora_alpha=meta["lora_alpha"])
    switches = tuple(meta["switch_frame_indices"])
    errs = chunk_errors(rollout(t, meta, dit, switches=switches), t["output"], meta["frames_per_chunk"])
    assert max(errs) <= TOL, f"longlive ({meta['commit'][:7]}): per-chunk max abs err {errs} > {TOL}"
    # controls: no re-cache (only the cross-attention cache replaced), and the LoRA at the wrong scale
    no_recache = chunk_errors(rollout(t, meta, dit, switches=switches, recache=False), t["output"], 3)
    assert max(no_recache[:2]) <= TOL and min(no_recache[2:]) > 1e-6, f"the re-cache must matter: {no_recache}"
    unscaled = chunk_errors(rollout(t, meta, our_dit(t, cfg), switches=switches), t["output"], 3)
    assert min(unscaled) > 1e-3, "alpha / r must matter"


def test_wan_vae_file_decodes_as_wans_own_decoder() -> None:
    """Wan 2.1's own VAE layout (Wan2.1_VAE.pth names) through `keys.wan_vae_to_diffusers` into our
    streaming decoder, chunks of 3 and 2 latent frames, against Wan's whole-video decode (its encoder
    half is not in the fixture: the decoder reads none of it)."""
    t, meta = fixture("wan_vae")
    n = meta["net"]
    cfg = WanVAEConfig(base_dim=n["dim"], z_dim=n["z_dim"], dim_mult=tuple(n["dim_mult"]),
                       num_res_blocks=n["num_res_blocks"], temporal_downsample=tuple(n["temperal_downsample"]),
                       latents_mean=tuple(meta["latents_mean"]), latents_std=tuple(meta["latents_std"]))
    state = {name: v for k, v in prefixed(t, "weights.").items() if (name := wan_vae_to_diffusers(k, cfg))}
    vae = WanVAEDecoder(cfg).double()
    load_state_strict(vae, state, what="fixture")
    z, cache, outs = t["z"], None, []
    for i, (a, b) in enumerate([(0, 3), (3, 5)]):
        frames, cache = vae.decode_chunk(z[:, :, a:b], cache, first_chunk=i == 0)
        outs.append(frames)
    ours = torch.cat(outs, dim=1).permute(0, 4, 1, 2, 3)  # (B, 3, T_pix, H, W)
    err = max_err(ours, t["output"])
    assert ours.shape == t["output"].shape and err <= TOL, f"VAE: max abs err {err} ({meta['commit'][:7]})"
    assert meta["clamped_fraction"] < 0.5, "most of the picture is inside [-1, 1]: the comparison means something"


def test_wan_umt5_file_encodes_as_wans_own_encoder() -> None:
    """Wan's own umT5 layout (models_t5_umt5-xxl-enc-bf16.pth names) into transformers' UMT5EncoderModel.
    transformers computes its RMS norm's variance in float32 by design, hence the looser tolerance."""
    t, meta = fixture("wan_t5")
    model = umt5_from_wan_state(prefixed(t, "weights."), dtype=torch.float64)
    with torch.no_grad():
        ours = model(input_ids=t["ids"], attention_mask=t["mask"]).last_hidden_state
    err = max_err(ours, t["output"])
    assert err <= 1e-5, f"umT5: max abs err {err} ({meta['commit'][:7]})"
    assert wan_t5_to_transformers("token_embedding.weight") == ["shared.weight", "encoder.embed_tokens.weight"]
