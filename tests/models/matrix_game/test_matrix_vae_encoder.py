"""The Wan 2.1 VAE encoder against diffusers' AutoencoderKLWan (fp64), and the first-frame conditioning table."""

from __future__ import annotations

import pytest
import torch

from tests.models.matrix_game.enc_refs import VAE_CFG, diffusers_encode, diffusers_vae, max_err
from worldcast.models.causal_wan.config import WanVAEConfig
from worldcast.models.matrix_game.vae_encoder import (
    MASK_CHANNELS,
    WanVAEEncoder,
    condition_frames,
    first_frame_condition,
)


def _ours(ref: torch.nn.Module) -> WanVAEEncoder:
    enc = WanVAEEncoder(VAE_CFG).double()
    enc.load_state_dict({k: v for k, v in ref.state_dict().items() if k.startswith(("encoder.", "quant_conv."))})
    return enc.eval()


@pytest.mark.parametrize("per_call", [None, 1, 3])
def test_matrix_vae_encode_equals_diffusers(per_call: int | None) -> None:
    """Parity: normalised posterior means of a 2-video batch, 1 + 4*6 frames, however the frames are split."""
    ref = diffusers_vae()
    g = torch.Generator().manual_seed(32)
    video = torch.rand(2, 3, 25, 32, 48, generator=g, dtype=torch.float64) * 2 - 1
    want = diffusers_encode(ref, video)
    got = _ours(ref).encode(video, latent_frames_per_call=per_call)
    assert got.shape == want.shape == (2, 16, 7, 4, 6)
    err = max_err(got, want)
    assert err <= 1e-12, f"max abs err {err:.3g} > 1e-12 vs AutoencoderKLWan.encode(...).mode(), normalised"
    assert want.abs().max() > 0.5, "the reference must produce non-trivial latents for the test to mean much"


def test_matrix_vae_single_frame_is_one_latent_frame() -> None:
    """One pixel frame encodes to one latent frame (the first frame of a session)."""
    ref = diffusers_vae()
    img = torch.rand(1, 3, 1, 32, 48, generator=torch.Generator().manual_seed(33), dtype=torch.float64) * 2 - 1
    got = _ours(ref).encode(img)
    assert got.shape == (1, 16, 1, 4, 6)
    assert max_err(got, diffusers_encode(ref, img)) <= 1e-12


def test_matrix_vae_condition_horizon_is_where_the_image_stops_mattering() -> None:
    """Frames >= S of encode([image, zeros...]) are all the same and free of the image; frame S - 1 is not."""
    with torch.device("meta"):
        assert WanVAEEncoder(WanVAEConfig()).condition_horizon() == 29  # the released VAE
    enc = _ours(diffusers_vae())
    S = enc.condition_horizon()
    assert S == 29
    g = torch.Generator().manual_seed(34)
    tails = []
    for _ in range(2):  # two different images
        img = torch.rand(1, 3, 1, 32, 48, generator=g, dtype=torch.float64) * 2 - 1
        lat = enc.encode(torch.cat([img, torch.zeros(1, 3, 4 * (S + 2), 32, 48, dtype=torch.float64)], dim=2))
        for n in (S + 1, S + 2):
            assert torch.equal(lat[:, :, n], lat[:, :, S]), f"latent frame {n} differs from frame {S}"
        assert not torch.equal(lat[:, :, S - 1], lat[:, :, S]), f"frame {S - 1} already stationary: S is not tight"
        tails.append(lat[:, :, S])
    assert torch.equal(tails[0], tails[1]), "the stationary frame must not depend on the image"


def test_matrix_condition_table_and_gather() -> None:
    """first_frame_condition = [mask, latents] of the padded video; condition_frames reads any frame index."""
    ref = diffusers_vae()
    enc = _ours(ref)
    S = enc.condition_horizon()
    img = torch.rand(2, 3, 32, 48, generator=torch.Generator().manual_seed(35), dtype=torch.float64) * 2 - 1
    table = first_frame_condition(enc, img, latent_frames_per_call=None)
    assert table.shape == (2, MASK_CHANNELS + 16, S + 1, 4, 6)
    want = diffusers_encode(ref, torch.cat([img[:, :, None], torch.zeros(2, 3, 4 * S, 32, 48, dtype=img.dtype)], 2))
    assert max_err(table[:, MASK_CHANNELS:], want) <= 1e-12
    assert torch.equal(table[:, :MASK_CHANNELS, 0], torch.ones_like(table[:, :MASK_CHANNELS, 0]))
    assert not table[:, :MASK_CHANNELS, 1:].any()
    idx = torch.tensor([[0, 1, 2], [S - 1, S, 1000]])
    got = condition_frames(table, idx)
    assert got.shape == (2, 20, 3, 4, 6)
    assert torch.equal(got[0], table[0, :, :3])
    assert torch.equal(got[1, :, 0], table[1, :, S - 1])
    assert torch.equal(got[1, :, 2], table[1, :, S]), "indices past the horizon read the stationary frame"


def test_matrix_vae_bad_input_is_refused() -> None:
    enc = WanVAEEncoder(VAE_CFG)
    with pytest.raises(ValueError, match="channels"):
        enc.encode(torch.zeros(1, 4, 1, 32, 48))
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        enc.encode(torch.zeros(1, 3, 4, 32, 48))
    with pytest.raises(ValueError, match="divide by 8"):
        enc.encode(torch.zeros(1, 3, 1, 30, 48))
    table = torch.zeros(2, 20, 30, 4, 6)
    with pytest.raises(ValueError, match=">= 0"):
        condition_frames(table, torch.tensor([[0], [-1]]))
    with pytest.raises(ValueError, match="B=2"):
        condition_frames(table, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="B, 3, H, W"):
        first_frame_condition(enc, torch.zeros(3, 32, 48))
