"""Loading: a Self-Forcing-layout .pt and a diffusers folder made from the same random weights
load to identical outputs; missing, unexpected and misshapen keys are refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.models.causal_wan.refs import diffusers_dit_kwargs, randomize_
from worldcast.models.causal_wan.config import WanVAEConfig, tiny
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.loading import (
    DIT_KEY_TABLE,
    WeightsError,
    diffusers_to_original,
    load_dit_pt,
    load_parts,
    original_to_diffusers,
)
from worldcast.models.causal_wan.text import TextEncoder

CFG = tiny()
VAE = WanVAEConfig(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                   latents_mean=(0.1, 0.2, 0.3, 0.4), latents_std=(1.0, 2.0, 0.5, 1.5))  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A diffusers-format folder written by diffusers' own save_pretrained, from seeded random weights."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    root = tmp_path_factory.mktemp("wan-diffusers")
    dit = WanTransformer3DModel(**diffusers_dit_kwargs(CFG))
    randomize_(dit, seed=31)
    dit.save_pretrained(root / "transformer")
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True], latents_mean=list(VAE.latents_mean), latents_std=list(VAE.latents_std),
    )  # fmt: skip
    randomize_(vae, seed=32)
    vae.save_pretrained(root / "vae")
    text = TextEncoder.tiny_random(dim=CFG.text_dim, text_len=CFG.text_len, seed=33)
    text.model.save_pretrained(root / "text_encoder")
    text.tokenizer.save_pretrained(root / "tokenizer")  # type: ignore[attr-defined]
    return root


#: diffusers -> original names, restated here independently of loading.DIT_KEY_TABLE (from Wan's
#: wan/modules/model.py module names), so a wrong row there fails this test.
_RENAMES = [
    (r"\.attn1\.to_out\.0\.", ".self_attn.o."), (r"\.attn2\.to_out\.0\.", ".cross_attn.o."),
    (r"\.attn1\.to_", ".self_attn."), (r"\.attn2\.to_", ".cross_attn."),
    (r"\.attn1\.", ".self_attn."), (r"\.attn2\.", ".cross_attn."),
    (r"^(blocks\.\d+)\.norm2\.", r"\1.norm3."), (r"\.ffn\.net\.0\.proj\.", ".ffn.0."), (r"\.ffn\.net\.2\.", ".ffn.2."),
    (r"^(blocks\.\d+)\.scale_shift_table$", r"\1.modulation"), (r"^scale_shift_table$", "head.modulation"),
    (r"^proj_out\.", "head.head."), (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
]  # fmt: skip


def _original_name(key: str) -> str:
    for pattern, repl in _RENAMES:
        key = re.sub(pattern, repl, key)
    return key


def _self_forcing_pt(folder: Path, path: Path, *, drop: str | None = None, extra: str | None = None) -> Path:
    """The same transformer weights in Self-Forcing's layout: {'generator': {'model.<original key>': ...}}."""
    from safetensors.torch import load_file

    state = {}
    for f in (folder / "transformer").glob("*.safetensors"):
        state.update({"model." + _original_name(k): v for k, v in load_file(str(f)).items()})
    if drop:
        del state[drop]
    if extra:
        state[extra] = torch.zeros(1)
    torch.save({"generator": state, "generator_ema": state}, path)
    return path


def _run(dit: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(34)
    x = torch.randn(1, 4, 3, 8, 8, generator=g)
    ctx = torch.randn(1, CFG.text_len, CFG.text_dim, generator=g)
    off = torch.tensor([6])
    attn = DenseSelfAttention(CFG, 1)
    attn.begin_chunk(off, 3)
    out = dit(x, torch.tensor([937.5]), off, dit.cross_kv(ctx), attn).flow
    assert out is not None
    return out


def test_pt_and_diffusers_folder_load_to_identical_outputs(folder: Path, tmp_path: Path) -> None:
    from_folder = load_parts(folder, cfg=CFG)
    pt = _self_forcing_pt(folder, tmp_path / "self_forcing.pt")
    from_pt = load_parts(pt, cfg=CFG, base_folder=folder)
    assert torch.equal(_run(from_folder.dit), _run(from_pt.dit))
    assert from_folder.cfg.vae.latents_std == VAE.latents_std  # read from vae/config.json
    # the VAE and text encoder load too, and run
    frames, cache = from_folder.vae.decode_chunk(torch.randn(1, 4, 3, 8, 8), None, first_chunk=True)
    assert frames.shape == (1, 9, 64, 64, 3) and len(cache) == len(from_folder.vae.cache_spec(64, 64))
    ctx = from_folder.text.encode(["a red car", "rain"])
    assert ctx.shape == (2, CFG.text_len, CFG.text_dim)


def test_ema_generator_and_errors_name_the_key(folder: Path, tmp_path: Path) -> None:
    pt = _self_forcing_pt(folder, tmp_path / "ok.pt")
    assert torch.equal(_run(load_dit_pt(pt, CFG, ema=True)), _run(load_dit_pt(pt, CFG)))
    bad = _self_forcing_pt(folder, tmp_path / "missing.pt", drop="model.blocks.1.cross_attn.k.weight")
    with pytest.raises(WeightsError, match=r"missing keys \['blocks.1.cross_attn.k.weight'\]"):
        load_dit_pt(bad, CFG)
    bad = _self_forcing_pt(folder, tmp_path / "extra.pt", extra="model.blocks.0.lora_A.weight")
    with pytest.raises(WeightsError, match=r"unexpected keys \['blocks.0.lora_A.weight'\]"):
        load_dit_pt(bad, CFG)
    torch.save({"generator": {"blocks.0.self_attn.q.weight": torch.zeros(1)}}, tmp_path / "noprefix.pt")
    with pytest.raises(WeightsError, match="start with 'model.'"):
        load_dit_pt(tmp_path / "noprefix.pt", CFG)
    torch.save({"optimizer": {}}, tmp_path / "nogen.pt")
    with pytest.raises(WeightsError, match="no 'generator'"):
        load_dit_pt(tmp_path / "nogen.pt", CFG)
    with pytest.raises(WeightsError, match="shape"):
        load_dit_pt(pt, tiny(ffn_dim=64))
    with pytest.raises(WeightsError, match="base folder"):
        load_parts(pt, cfg=CFG)


def test_unknown_diffusers_key_is_named() -> None:
    with pytest.raises(WeightsError, match="condition_embedder.image_embedder.ff.net.0.proj.weight"):
        diffusers_to_original("condition_embedder.image_embedder.ff.net.0.proj.weight")


def test_table_maps_every_parameter_both_ways() -> None:
    from diffusers import WanTransformer3DModel

    from worldcast.models.causal_wan.dit import CausalWanDiT

    theirs = set(WanTransformer3DModel(**diffusers_dit_kwargs(CFG)).state_dict())
    ours = set(CausalWanDiT(CFG).state_dict())
    assert {diffusers_to_original(k) for k in theirs} == ours
    assert {original_to_diffusers(k) for k in ours} == theirs
    assert len(DIT_KEY_TABLE) == 24
