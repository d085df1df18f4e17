"""Parity with Matrix-Game 2.0's own code, through committed fixtures (regen_encoder_fixtures.py).

The fixtures hold the release's tiny-weight outputs in float64: its `cond_concat` (the image
then 4 (N - 1) zero frames through its WanVAE, and the mask), its `CLIPModel.encode_video`
tokens, and SHA-256s of its crop-and-resize; the weights are the release modules' own state
dicts (original key names), so loading them also checks the key tables against the release.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import torch

from tests.models.matrix_game.enc_refs import fixture, fixture_clip_config, max_err, substate
from worldcast.models.causal_wan.config import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD
from worldcast.models.causal_wan.loading import load_state_strict
from worldcast.models.matrix_game.image_encoder import ClipImageEncoder
from worldcast.models.matrix_game.loading_encoders import clip_state_from_original, vae_state_from_original
from worldcast.models.matrix_game.preprocess import fit_image, image_to_tensor
from worldcast.models.matrix_game.vae_encoder import (
    WanVAEEncoder,
    condition_frames,
    first_frame_condition,
    tiny_vae_config,
)

TENSORS, META = fixture()


def test_matrix_fixture_names_its_reference() -> None:
    assert re.fullmatch(r"[0-9a-f]{40}", META["reference"]["commit"]), "the reference commit must be recorded"
    assert META["reference"]["folder"] == "Matrix-Game-2"


def test_matrix_fit_image_equals_release_crop_and_resize() -> None:
    """fit_image's pixels are the release's `_resizecrop` + `frame_process` pixels, byte for byte."""
    for key, want in META["geometry"].items():
        name, size = key.split("_")
        h, w = (int(v) for v in size.split("x"))
        out = fit_image(TENSORS[f"image.{name}"].numpy(), height=h, width=w)
        got = hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest()
        assert got == want["sha256"], f"{key}: our crop/resize differs from the release's"


def test_matrix_first_frame_condition_equals_release_cond_concat() -> None:
    """Our table read at latent frames 0..N-1 equals the release's cond_concat for N = 32 (> the horizon 29)."""
    c = META["vae"]["config"]
    # the release keeps latents_mean/std as float32 tensors: its fp64 run normalises with those roundings
    mean, std = TENSORS["vae.latents_mean"], TENSORS["vae.latents_std"]
    assert torch.equal(mean, torch.tensor(WAN21_LATENTS_MEAN).double())
    assert torch.equal(std, torch.tensor(WAN21_LATENTS_STD).double())
    cfg = tiny_vae_config(base_dim=c["dim"], dim_mult=tuple(c["dim_mult"]), num_res_blocks=c["num_res_blocks"],
                          latents_mean=tuple(mean.tolist()), latents_std=tuple(std.tolist()))
    state = vae_state_from_original(substate(TENSORS, "vae.state."), cfg, what="fixture")
    enc = WanVAEEncoder(cfg).double()
    load_state_strict(enc, {k: v for k, v in state.items() if k.startswith(("encoder.", "quant_conv."))},
                      what="fixture")  # fmt: skip
    want = TENSORS["vae.cond_concat"]  # (1, 20, N, 4, 6)
    n, h, w = want.shape[2], want.shape[3] * 8, want.shape[4] * 8
    image = image_to_tensor(fit_image(TENSORS["image.wide"].numpy(), height=h, width=w)).double()
    table = first_frame_condition(enc, image, latent_frames_per_call=None)
    got = condition_frames(table, torch.arange(n)[None])
    err = max_err(got, want)
    assert err <= 1e-12, f"max abs err {err:.3g} > 1e-12 vs the release's cond_concat (fp64)"
    assert max_err(got[:, 4:, 1:], want[:, 4:, :1]) > 0.1, "the zero frames' latents must differ from the image's"


def test_matrix_clip_equals_release_encode_video() -> None:
    """Our 257 tokens equal the release's CLIPModel.encode_video (use_31_block) on 352x640 first frames."""
    cfg = fixture_clip_config(META)
    enc = ClipImageEncoder(cfg).double()
    load_state_strict(enc.model, clip_state_from_original(substate(TENSORS, "clip.state."), cfg, what="fixture"),
                      what="fixture")  # fmt: skip
    for name in ("wide", "tall"):
        image = image_to_tensor(fit_image(TENSORS[f"image.{name}"].numpy())).double()
        want = TENSORS[f"clip.visual_context.{name}"]
        got = enc(image)
        assert got.shape == want.shape == (1, 257, cfg.width)
        err = max_err(got, want)
        assert err <= 1e-12, f"{name}: max abs err {err:.3g} > 1e-12 vs the release's encode_video (fp64, lifted)"
        if name == "wide":  # as shipped, its LayerNorms round through float32
            err = max_err(got, TENSORS["clip.visual_context_as_shipped.wide"])
            assert err <= 1e-5, f"max abs err {err:.3g} > 1e-5 vs the release's encode_video as shipped"
