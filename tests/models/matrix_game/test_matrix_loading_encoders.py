"""Loading the encoder files: the Wan 2.1 VAE `.pth` (original names) or diffusers folder; the CLIP `.pth` or
transformers folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.models.causal_wan.refs import randomize_
from tests.models.matrix_game.enc_refs import VAE_CFG, diffusers_encode, diffusers_vae, max_err
from worldcast.models.causal_wan.loading import WeightsError
from worldcast.models.matrix_game.image_encoder import ClipImageEncoder, tiny_clip_config
from worldcast.models.matrix_game.loading_encoders import (
    clip_state_from_original,
    diffusers_vae_key_to_original,
    load_image_encoder,
    load_wan_vae,
    vae_key_table,
)

# -----------------------------------------------------------------------------
# VAE


def _original_pth(tmp_path: Path, ref: torch.nn.Module, *, drop: str | None = None, add: str | None = None) -> Path:
    state = {diffusers_vae_key_to_original(k, VAE_CFG): v for k, v in ref.state_dict().items()}
    if drop:
        del state[drop]
    if add:
        state[add] = torch.zeros(1)
    path = tmp_path / "Wan2.1_VAE.pth"
    torch.save(state, path)
    return path


def test_matrix_vae_key_table_names_the_release_modules() -> None:
    """Spot checks of the original <-> diffusers table (full Wan 2.1 VAE: 194 tensors)."""
    from worldcast.models.causal_wan.config import WanVAEConfig

    t = vae_key_table(WanVAEConfig())
    assert len(t) == 194
    assert t["conv1.weight"] == "quant_conv.weight" and t["conv2.bias"] == "post_quant_conv.bias"
    assert t["encoder.conv1.weight"] == "encoder.conv_in.weight"
    assert t["encoder.downsamples.2.resample.1.weight"] == "encoder.down_blocks.2.resample.1.weight"
    assert t["encoder.downsamples.5.time_conv.bias"] == "encoder.down_blocks.5.time_conv.bias"
    assert t["encoder.downsamples.3.shortcut.weight"] == "encoder.down_blocks.3.conv_shortcut.weight"
    assert t["encoder.middle.1.to_qkv.weight"] == "encoder.mid_block.attentions.0.to_qkv.weight"
    assert t["encoder.middle.2.residual.6.weight"] == "encoder.mid_block.resnets.1.conv2.weight"
    assert t["encoder.head.0.gamma"] == "encoder.norm_out.gamma"
    assert t["decoder.upsamples.3.time_conv.weight"] == "decoder.up_blocks.0.upsamplers.0.time_conv.weight"
    assert t["decoder.upsamples.4.residual.3.gamma"] == "decoder.up_blocks.1.resnets.0.norm2.gamma"
    assert t["decoder.upsamples.14.residual.2.bias"] == "decoder.up_blocks.3.resnets.2.conv1.bias"
    assert t["decoder.head.2.weight"] == "decoder.conv_out.weight"


def test_matrix_vae_pth_loads_encoder_and_decoder(tmp_path: Path) -> None:
    """A .pth in original names gives diffusers' encode (fp64) and the decoder's exact weights."""
    ref = diffusers_vae()
    parts = load_wan_vae(_original_pth(tmp_path, ref), VAE_CFG, dtype=torch.float64)
    video = torch.rand(1, 3, 9, 32, 48, generator=torch.Generator().manual_seed(51), dtype=torch.float64) * 2 - 1
    assert max_err(parts.encoder.encode(video), diffusers_encode(ref, video)) <= 1e-12
    assert parts.decoder is not None
    want = {k: v for k, v in ref.state_dict().items() if k.startswith(("decoder.", "post_quant_conv."))}
    got = parts.decoder.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert load_wan_vae(tmp_path, VAE_CFG, decoder=False).decoder is None  # a folder holding the .pth


def test_matrix_vae_diffusers_folder_loads(tmp_path: Path) -> None:
    ref = diffusers_vae()
    ref.save_pretrained(tmp_path / "vae", safe_serialization=True)
    parts = load_wan_vae(tmp_path, dtype=torch.float64)
    assert parts.encoder.cfg.latents_mean == pytest.approx(VAE_CFG.latents_mean)
    video = torch.rand(1, 3, 5, 32, 48, generator=torch.Generator().manual_seed(52), dtype=torch.float64) * 2 - 1
    assert max_err(parts.encoder.encode(video), diffusers_encode(ref, video)) <= 1e-12


def test_matrix_vae_missing_and_unexpected_keys_are_named(tmp_path: Path) -> None:
    ref = diffusers_vae()
    with pytest.raises(WeightsError, match=r"missing keys \['encoder.downsamples.4.residual.2.bias'\]"):
        load_wan_vae(_original_pth(tmp_path, ref, drop="encoder.downsamples.4.residual.2.bias"), VAE_CFG)
    with pytest.raises(WeightsError, match=r"unexpected keys \['encoder.extra.weight'\]"):
        load_wan_vae(_original_pth(tmp_path, ref, add="encoder.extra.weight"), VAE_CFG)
    with pytest.raises(WeightsError, match=r"missing keys \['encoder.downsamples.6.shortcut.bias'"):
        load_wan_vae(_original_pth(tmp_path, ref))  # the full-size layout (wider stages) over the tiny file
    state = torch.load(_original_pth(tmp_path, ref), weights_only=True)
    state["encoder.conv1.weight"] = torch.zeros(5, 3, 3, 3, 3)
    torch.save(state, tmp_path / "Wan2.1_VAE.pth")
    with pytest.raises(WeightsError, match=r"encoder.conv_in.weight has shape \(5, 3, 3, 3, 3\)"):
        load_wan_vae(tmp_path / "Wan2.1_VAE.pth", VAE_CFG)
    with pytest.raises(FileNotFoundError):
        load_wan_vae(tmp_path / "nothing.pth")


# -----------------------------------------------------------------------------
# CLIP


def _release_clip_state(ours: ClipImageEncoder, *, layers: int) -> dict[str, torch.Tensor]:
    """A state dict laid out as the release's XLMRobertaCLIP (written here independently of the loader):
    the vision tower with one more layer than ours runs, a vision head, a text tower and log_scale."""
    s = ours.model.state_dict()
    g = torch.Generator().manual_seed(53)
    w = ours.cfg.width
    out = {
        "visual.patch_embedding.weight": s["embeddings.patch_embedding.weight"],
        "visual.cls_embedding": s["embeddings.class_embedding"].view(1, 1, w),
        "visual.pos_embedding": s["embeddings.position_embedding.weight"][None],
        "visual.pre_norm.weight": s["pre_layrnorm.weight"], "visual.pre_norm.bias": s["pre_layrnorm.bias"],
        "visual.post_norm.weight": s["post_layernorm.weight"], "visual.post_norm.bias": s["post_layernorm.bias"],
        "visual.head": torch.randn(w, 8, generator=g), "log_scale": torch.tensor(2.6),
        "textual.token_embedding.weight": torch.randn(10, 8, generator=g),
    }  # fmt: skip
    for i in range(layers):
        src = i if i < ours.cfg.run_layers else 0  # the extra layer: any values, it is never run
        p = f"encoder.layers.{src}."
        for sfx in ("weight", "bias"):
            qkv = [s[f"{p}self_attn.{n}_proj.{sfx}"] for n in "qkv"]
            out[f"visual.transformer.{i}.attn.to_qkv.{sfx}"] = torch.cat(qkv)
            for a, b in (("norm1", "layer_norm1"), ("norm2", "layer_norm2"), ("attn.proj", "self_attn.out_proj"),
                         ("mlp.0", "mlp.fc1"), ("mlp.2", "mlp.fc2")):  # fmt: skip
                out[f"visual.transformer.{i}.{a}.{sfx}"] = s[f"{p}{b}.{sfx}"]
    return out


def _tiny_clip() -> ClipImageEncoder:
    enc = ClipImageEncoder(tiny_clip_config()).double()
    randomize_(enc, seed=54, scale=0.2)
    return enc


def test_matrix_clip_release_pth_loads(tmp_path: Path) -> None:
    ours = _tiny_clip()
    torch.save(_release_clip_state(ours, layers=ours.cfg.layers), tmp_path / "clip.pth")
    got = load_image_encoder(tmp_path / "clip.pth", ours.cfg, dtype=torch.float64)
    img = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(55), dtype=torch.float64) * 2 - 1
    assert torch.equal(got(img), ours(img))


def test_matrix_clip_missing_and_unexpected_keys_are_named() -> None:
    ours = _tiny_clip()
    state = _release_clip_state(ours, layers=ours.cfg.layers)
    cfg = ours.cfg
    bad = dict(state)
    del bad["visual.transformer.1.mlp.0.weight"]
    with pytest.raises(WeightsError, match=r"model needs|missing"):
        from worldcast.models.causal_wan.loading import load_state_strict

        load_state_strict(ClipImageEncoder(cfg).model, clip_state_from_original(bad, cfg, what="x"), what="x")
    bad = dict(state)
    del bad["visual.transformer.0.attn.to_qkv.weight"], bad["visual.transformer.0.attn.to_qkv.bias"]
    with pytest.raises(WeightsError, match=r"missing keys \['visual.transformer.0.attn.to_qkv'\]"):
        clip_state_from_original(bad, cfg, what="x")
    with pytest.raises(WeightsError, match=r"unexpected keys \['visual.extra'\]"):
        clip_state_from_original({**state, "visual.extra": torch.zeros(1)}, cfg, what="x")


def test_matrix_clip_transformers_folder_loads(tmp_path: Path) -> None:
    """A transformers folder (all 3 layers, older `vision_model.` names and position_ids) loads its first 2."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    cfg = tiny_clip_config()
    ref = CLIPVisionModel(CLIPVisionConfig(
        hidden_size=cfg.width, intermediate_size=cfg.mlp_dim, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, image_size=cfg.image_size, patch_size=cfg.patch_size, hidden_act="gelu",
    ))  # fmt: skip
    randomize_(ref, seed=56, scale=0.2)
    folder = tmp_path / "image_encoder"
    ref.save_pretrained(folder)
    legacy = {f"vision_model.{k}": v.contiguous() for k, v in ref.state_dict().items()}
    legacy["vision_model.embeddings.position_ids"] = torch.arange(257)[None]
    (folder / "model.safetensors").unlink()
    save_file(legacy, str(folder / "model.safetensors"))
    enc = load_image_encoder(tmp_path)
    assert enc.cfg.run_layers == 2 and len(enc.model.encoder.layers) == 2
    img = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(57)) * 2 - 1
    from worldcast.models.matrix_game.image_encoder import clip_pixels

    with torch.no_grad():
        want = ref(pixel_values=clip_pixels(img, 224), output_hidden_states=True).hidden_states[-2]
    assert max_err(enc(img), want) <= 1e-5  # float32
