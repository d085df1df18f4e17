"""Parity (c): streaming decode with the externally held cache equals diffusers' AutoencoderKLWan.decode."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.models.causal_wan.refs import lifted_fp32_casts, max_err, randomize_
from worldcast.models.causal_wan.config import WanVAEConfig, tiny
from worldcast.models.causal_wan.vae import WanVAEDecoder, conv3d_by_frames, frames_to_uint8

MEAN = (0.3, -0.2, 0.1, 0.5)
STD = (1.5, 0.7, 1.1, 2.0)
CFG = WanVAEConfig(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1, latents_mean=MEAN, latents_std=STD)


def _pair() -> tuple[torch.nn.Module, WanVAEDecoder]:
    """diffusers' AutoencoderKLWan and ours, same seeded weights, float64.

    With `lifted`, the reference runs under `lifted_fp32_casts` (its WanUpsample round-trips through
    float32 with `.float()`; nothing else in the decoder does)."""
    from diffusers import AutoencoderKLWan

    ref = AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True], latents_mean=list(MEAN), latents_std=list(STD),
    ).double().eval()  # fmt: skip
    randomize_(ref, seed=21, scale=0.3)
    ours = WanVAEDecoder(CFG).double()
    state = {k: v for k, v in ref.state_dict().items() if k.startswith(("decoder.", "post_quant_conv."))}
    ours.load_state_dict(state, strict=True)
    return ref, ours


def _reference_decode(ref: torch.nn.Module, z: torch.Tensor, *, lifted: bool) -> torch.Tensor:
    """The pipeline's way: unnormalise, then vae.decode (frame 0 alone first, then one frame at a time)."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, -1, 1, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, -1, 1, 1, 1)
    with torch.no_grad(), lifted_fp32_casts() if lifted else contextlib.nullcontext():
        return ref.decode(z * std + mean).sample  # (B, 3, T_pix, H, W)


def _stream(ours: WanVAEDecoder, z: torch.Tensor, splits: list[int]) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    cache, outs, caches, start = None, [], [], 0
    for i, n in enumerate(splits):
        before = [c.clone() for c in cache] if cache is not None else None
        per_call = 1 if i % 2 else None  # both ways of running the decoder: frame by frame, whole chunk
        frames, new = ours.decode_chunk(z[:, :, start : start + n], cache, first_chunk=i == 0, frames_per_call=per_call)
        if cache is not None and before is not None:
            assert all(torch.equal(a, b) for a, b in zip(cache, before)), "decode_chunk wrote into the old cache"
            assert all(a.data_ptr() != b.data_ptr() for a, b in zip(cache, new)), "new cache must be new tensors"
        assert frames.shape[1] == (4 * n - 3 if i == 0 else 4 * n)
        outs.append(frames)
        caches.append(new)
        cache, start = new, start + n
    return torch.cat(outs, dim=1).permute(0, 4, 1, 2, 3), caches


@pytest.mark.parametrize(
    "splits, lifted, tol",
    [
        ([3, 3, 1], True, 1e-12),
        ([1, 3, 3], True, 1e-12),
        ([1, 1, 1, 1, 1, 1, 1], True, 1e-12),
        ([3, 3, 1], False, 1e-6),  # as shipped: WanUpsample rounds through float32 (measured 3e-7)
    ],
)
def test_streaming_decode_equals_whole_decode(splits: list[int], lifted: bool, tol: float) -> None:
    g = torch.Generator().manual_seed(22)
    z = torch.randn(2, 4, sum(splits), 4, 6, generator=g, dtype=torch.float64)
    ref, ours = _pair()
    want = _reference_decode(ref, z, lifted=lifted)
    got, caches = _stream(ours, z, splits)
    assert got.shape == want.shape == (2, 3, 1 + 4 * (sum(splits) - 1), 32, 48)
    err = max_err(got, want)
    why = "its float32 casts lifted" if lifted else "as shipped: its WanUpsample rounds through float32"
    assert err <= tol, f"max abs err {err:.3g} > {tol} vs AutoencoderKLWan.decode ({why})"
    assert (want.abs() < 1).float().mean() > 0.3, "most outputs must be unclamped for the test to mean much"
    spec = ours.cache_spec(32, 48)
    for cache in caches:  # a fixed shape after every chunk, the first included
        assert [tuple(c.shape[1:]) for c in cache] == [s for s, _ in spec]


def test_streaming_needs_its_first_frame_alone() -> None:
    """Control: decoding the first chunk without the first-frame rule does not match."""
    ref, ours = _pair()
    z = torch.randn(1, 4, 4, 4, 6, generator=torch.Generator().manual_seed(23), dtype=torch.float64)
    want = _reference_decode(ref, z, lifted=True)
    frames, _ = ours.decode_chunk(z, ours.zero_cache(1, 32, 48), first_chunk=False)
    assert frames.shape[1] == 16 != want.shape[2] == 13


def test_full_size_cache_spec() -> None:
    """The full Wan 2.1 decoder at 480x832: 32 cache tensors, about 1.9 GB in bf16 per session."""
    with torch.device("meta"):
        vae = WanVAEDecoder(WanVAEConfig())
    vae = vae.to(torch.bfloat16)
    spec = vae.cache_spec(480, 832)
    assert len(spec) == 32
    assert spec[0][0] == (16, 2, 60, 104) and spec[-1][0] == (96, 2, 480, 832)
    assert 1.85e9 < vae.cache_bytes(480, 832) < 1.95e9


def test_bad_input_is_refused() -> None:
    _, ours = _pair()
    z = torch.zeros(1, 4, 3, 4, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="channels"):
        ours.decode_chunk(torch.zeros(1, 5, 3, 4, 6), None, first_chunk=True)
    with pytest.raises(ValueError, match="needs the"):
        ours.decode_chunk(z, None, first_chunk=False)
    _, cache = ours.decode_chunk(z, None, first_chunk=True)
    with pytest.raises(ValueError, match=r"cache\[0\]"):
        ours.decode_chunk(z[:, :, :, :2], cache, first_chunk=False)


def test_uint8_frames() -> None:
    f = torch.tensor([-1.0, 0.0, 1.0, -0.999])
    assert frames_to_uint8(f).tolist() == [0, 128, 255, 0]
    assert tiny().pixel_frames(3, first_chunk=True) == 9 and tiny().pixel_frames(3, first_chunk=False) == 12


@pytest.mark.parametrize("kernel, pad", [((3, 3, 3), (1, 1)), ((3, 1, 1), (0, 0)), ((1, 1, 1), (0, 0))])
def test_cpu_conv_by_frames_equals_conv3d(kernel: tuple[int, int, int], pad: tuple[int, int]) -> None:
    """The CPU path (one 2D conv per temporal tap) computes F.conv3d, which CUDA runs."""
    g = torch.Generator().manual_seed(24)
    x = torch.randn(2, 5, 6, 7, 9, generator=g, dtype=torch.float64)
    w = torch.randn(4, 5, *kernel, generator=g, dtype=torch.float64)
    b = torch.randn(4, generator=g, dtype=torch.float64)
    want = torch.nn.functional.conv3d(x, w, b, padding=(0, *pad))
    assert max_err(conv3d_by_frames(x, w, b, pad), want) <= 1e-12
