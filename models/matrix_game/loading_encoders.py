"""Loading Matrix-Game 2.0's encoder files: the Wan 2.1 VAE and the CLIP vision tower.

What the release ships beside each variant's DiT (`Matrix-Game-2/wan/vae/wanx_vae.py`,
`get_wanx_vae_wrapper`):
- `Wan2.1_VAE.pth`: a plain state dict of the original Wan 2.1 `VideoVAE_` (encoder,
  `conv1` = quant conv, `conv2` = post-quant conv, decoder), original key names.
- `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`: a plain state dict of the whole
  `XLMRobertaCLIP` (`visual.*` vision tower, `textual.*` text tower, `log_scale`).
Converted folders (diffusers `AutoencoderKLWan` in `vae/`, transformers `CLIPVisionModel` in
`image_encoder/`, as diffusers' Wan i2v and FastVideo's Matrix-Game folders have them) load too.

Every key is mapped through an explicit table (`vae_key_table`, `CLIP_KEY_TABLE`) or named
in a table of keys the model never uses (`CLIP_UNUSED`); a missing or unexpected key raises
`WeightsError` naming it. Nothing here downloads anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from worldcast.models.causal_wan.config import WanVAEConfig
from worldcast.models.causal_wan.loading import (
    WeightsError,
    load_state_strict,
    read_config,
    read_safetensors_dir,
    vae_config_from_diffusers,
)
from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.matrix_game.image_encoder import ClipImageEncoder, ClipVisionConfig
from worldcast.models.matrix_game.vae_encoder import WanVAEEncoder

VAE_FILE = "Wan2.1_VAE.pth"  #: the release's VAE file name
CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"  #: the release's CLIP file name


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """A flat {name: tensor} from a `.pth`/`.pt` (torch.load, weights only) or a `.safetensors` file.

    Raises:
        FileNotFoundError: no such file. WeightsError: not a flat dict of tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path}: expected a flat state dict of tensors")
    return state


# -----------------------------------------------------------------------------
# The Wan 2.1 VAE: original (Wan2.1_VAE.pth) <-> diffusers AutoencoderKLWan names

#: Rules from diffusers names to original ones, applied first match wins; `{res}` is a residual
#: block's leaf (RESIDUAL_LEAVES), `{flat}` the decoder's flat index of (stage, slot).
VAE_RULES: tuple[tuple[str, str], ...] = (
    (r"quant_conv\.(.+)", r"conv1.{0}"),
    (r"post_quant_conv\.(.+)", r"conv2.{0}"),
    (r"(encoder|decoder)\.conv_in\.(.+)", r"{0}.conv1.{1}"),
    (r"(encoder|decoder)\.norm_out\.(.+)", r"{0}.head.0.{1}"),
    (r"(encoder|decoder)\.conv_out\.(.+)", r"{0}.head.2.{1}"),
    (r"(encoder|decoder)\.mid_block\.resnets\.0\.(.+)", r"{0}.middle.0.{res1}"),
    (r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)", r"{0}.middle.1.{1}"),
    (r"(encoder|decoder)\.mid_block\.resnets\.1\.(.+)", r"{0}.middle.2.{res1}"),
    (r"encoder\.down_blocks\.(\d+)\.(.+)", r"encoder.downsamples.{0}.{res1}"),
    (r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", r"decoder.upsamples.{flat}.{res2}"),
    (r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)", r"decoder.upsamples.{flat}.{1}"),
)
#: residual block leaves: diffusers -> original (`residual` is the original's nn.Sequential)
RESIDUAL_LEAVES: tuple[tuple[str, str], ...] = (
    ("norm1.", "residual.0."), ("conv1.", "residual.2."), ("norm2.", "residual.3."),
    ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut."),
)  # fmt: skip


def _leaf(tail: str) -> str:
    for ours, theirs in RESIDUAL_LEAVES:
        if tail.startswith(ours):
            return theirs + tail[len(ours) :]
    return tail  # a downsampler's resample.1.* / time_conv.*, unchanged


def diffusers_vae_key_to_original(key: str, cfg: WanVAEConfig) -> str:
    """One diffusers `AutoencoderKLWan` key -> its name in `Wan2.1_VAE.pth`.

    The decoder's original `upsamples` list is flat: per stage num_res_blocks + 1 residual
    blocks, then the upsampler, so (stage s, slot j) is index s * (num_res_blocks + 2) + j.

    Raises:
        WeightsError: no rule matches the key.
    """
    per_stage = cfg.num_res_blocks + 2
    for pattern, template in VAE_RULES:
        m = re.fullmatch(pattern, key)
        if not m:
            continue
        g = m.groups()
        flat = ""
        if "{flat}" in template:
            slot = int(g[1]) if "resnets" in pattern else cfg.num_res_blocks + 1
            flat = str(int(g[0]) * per_stage + slot)
        res1 = _leaf(g[1]) if len(g) > 1 else ""
        res2 = _leaf(g[2]) if len(g) > 2 else ""
        return template.format(*g, res1=res1, res2=res2, flat=flat)
    raise WeightsError(f"no row of VAE_RULES maps the VAE key {key!r}")


def vae_key_table(cfg: WanVAEConfig) -> dict[str, str]:
    """original name -> diffusers name, for every parameter of the encoder, decoder and both 1x1 convs."""
    with torch.device("meta"):
        names = [*WanVAEEncoder(cfg).state_dict(), *WanVAEDecoder(cfg).state_dict()]
    table = {diffusers_vae_key_to_original(k, cfg): k for k in names}
    assert len(table) == len(names), "two diffusers keys map to one original key"
    return table


def vae_state_from_original(
    state: dict[str, torch.Tensor], cfg: WanVAEConfig, *, what: str
) -> dict[str, torch.Tensor]:
    """A `Wan2.1_VAE.pth` state dict renamed to diffusers names.

    Raises:
        WeightsError: keys the table lacks (unexpected) or keys the model needs that the file lacks (missing).
    """
    table = vae_key_table(cfg)
    missing = sorted(set(table) - set(state))
    unexpected = sorted(set(state) - set(table))
    if missing or unexpected:
        raise WeightsError(f"{what}: missing keys {missing[:10]}, unexpected keys {unexpected[:10]}")
    return {table[k]: v for k, v in state.items()}


@dataclass
class WanVAEParts:
    """The VAE's two halves (stateless across sessions)."""

    encoder: WanVAEEncoder
    decoder: WanVAEDecoder | None


def _vae_folder(path: Path) -> Path:
    return path / "vae" if (path / "vae").is_dir() else path


def load_wan_vae(
    path: str | Path, cfg: WanVAEConfig | None = None, *, decoder: bool = True,
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> WanVAEParts:
    """The Wan 2.1 VAE encoder (and decoder) from the release's `.pth` or a diffusers folder.

    Args:
        path: `Wan2.1_VAE.pth` (a file, original names); or a folder holding it; or a
            diffusers folder (`vae/` inside it, or the `vae` folder itself: config.json and
            diffusion_pytorch_model*.safetensors).
        cfg: sizes for a `.pth` (default: the Wan 2.1 VAE); a diffusers folder's config.json wins.
        decoder: also build the decoder (`WanVAEDecoder`, as `models/causal_wan` streams it).

    Raises:
        WeightsError: missing/unexpected keys (named), misshapen ones, a Wan 2.2 config.
        FileNotFoundError: nothing at `path`.
    """
    path = Path(path)
    if path.is_dir() and (path / VAE_FILE).is_file():
        path = path / VAE_FILE
    if path.is_file():
        cfg = cfg or WanVAEConfig()
        state = vae_state_from_original(read_checkpoint(path), cfg, what=str(path))
    elif path.is_dir():
        folder = _vae_folder(path)
        v = read_config(folder)
        if v.get("is_residual") or v.get("patch_size"):
            raise WeightsError(f"{folder}: the Wan 2.2 VAE (is_residual / patch_size) is not supported")
        cfg = vae_config_from_diffusers(v)
        state = read_safetensors_dir(folder)
    else:
        raise FileNotFoundError(path)
    enc_side = ("encoder.", "quant_conv.")
    enc = WanVAEEncoder(cfg).to(dtype)  # built in the target dtype, so fp64 loads lose nothing
    load_state_strict(enc, {k: t for k, t in state.items() if k.startswith(enc_side)}, what=f"{path} (encoder)")
    dec = None
    dec_state = {k: t for k, t in state.items() if not k.startswith(enc_side)}
    if decoder:
        dec = WanVAEDecoder(cfg).to(dtype)
        load_state_strict(dec, dec_state, what=f"{path} (decoder)")
        dec = dec.to(dtype=dtype, device=device).eval()
    else:
        strays = sorted(k for k in dec_state if not k.startswith(("decoder.", "post_quant_conv.")))
        if strays:
            raise WeightsError(f"{path}: unexpected keys {strays[:10]}")
    return WanVAEParts(encoder=enc.to(dtype=dtype, device=device).eval(), decoder=dec)


# -----------------------------------------------------------------------------
# CLIP: the release's XLMRobertaCLIP `visual.*` <-> transformers CLIPVisionModel

#: original (release clip.py) -> transformers CLIPVisionModel; `{i}` a layer index. `to_qkv`
#: holds q, k, v stacked along its output rows; the class and position embeddings drop a
#: leading (1, ...) of the original.
CLIP_KEY_TABLE: tuple[tuple[str, str], ...] = (
    ("visual.patch_embedding.weight", "embeddings.patch_embedding.weight"),
    ("visual.cls_embedding", "embeddings.class_embedding"),
    ("visual.pos_embedding", "embeddings.position_embedding.weight"),
    ("visual.pre_norm", "pre_layrnorm"),
    ("visual.transformer.{i}.norm1", "encoder.layers.{i}.layer_norm1"),
    ("visual.transformer.{i}.attn.to_qkv", "encoder.layers.{i}.self_attn.{{q,k,v}}_proj"),
    ("visual.transformer.{i}.attn.proj", "encoder.layers.{i}.self_attn.out_proj"),
    ("visual.transformer.{i}.norm2", "encoder.layers.{i}.layer_norm2"),
    ("visual.transformer.{i}.mlp.0", "encoder.layers.{i}.mlp.fc1"),
    ("visual.transformer.{i}.mlp.2", "encoder.layers.{i}.mlp.fc2"),
    ("visual.post_norm", "post_layernorm"),
)
#: key prefixes of the release's file the image features never use: the text tower, the
#: contrastive scale, the vision head; also unused: `visual.transformer.{i}.*` for i >= run_layers
CLIP_UNUSED: tuple[str, ...] = ("textual.", "log_scale", "visual.head")
#: key prefixes of a transformers folder never used: the legacy position-id buffer, the projection
#: head of CLIPVisionModelWithProjection; also `encoder.layers.{i}.*` for i >= run_layers
CLIP_UNUSED_TRANSFORMERS: tuple[str, ...] = ("embeddings.position_ids", "visual_projection.")


def _later_layer(key: str, prefix: str, run: int) -> bool:
    m = re.match(re.escape(prefix) + r"(\d+)\.", key)
    return bool(m) and int(m.group(1)) >= run


def clip_state_from_original(
    state: dict[str, torch.Tensor], cfg: ClipVisionConfig, *, what: str
) -> dict[str, torch.Tensor]:
    """The release's CLIP state dict -> `ClipImageEncoder.model` names (`CLIP_KEY_TABLE`).

    Raises:
        WeightsError: a key neither mapped nor in CLIP_UNUSED (unexpected), or a needed one absent (missing).
    """
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    suffixes = (".weight", ".bias", "")

    def take(key: str) -> torch.Tensor | None:
        if key in state:
            used.add(key)
            return state[key]
        return None

    missing = []
    for orig, ours in CLIP_KEY_TABLE:
        layers = range(cfg.run_layers) if "{i}" in orig else [None]
        for i in layers:
            o = orig.format(i=i) if i is not None else orig
            t = ours.format(i=i) if i is not None else ours
            found = False
            for sfx in suffixes:
                v = take(o + sfx)
                if v is None:
                    continue
                found = True
                if "{q,k,v}" in t:
                    for name, part in zip("qkv", v.chunk(3, dim=0)):
                        out[t.replace("{q,k,v}", name) + sfx] = part
                elif o.endswith("cls_embedding"):
                    out[t + sfx] = v.reshape(v.shape[-1])  # (1, 1, D) -> (D,)
                elif o.endswith("pos_embedding"):
                    out[t + sfx] = v.reshape(v.shape[-2:])  # (1, N, D) -> (N, D)
                else:
                    out[t + sfx] = v
            if not found:
                missing.append(o)
    unexpected = []
    for k in sorted(set(state) - used):
        if k.startswith(CLIP_UNUSED):
            continue
        if _later_layer(k, "visual.transformer.", cfg.run_layers):
            continue
        unexpected.append(k)
    if missing or unexpected:
        raise WeightsError(f"{what}: missing keys {missing[:10]}, unexpected keys {unexpected[:10]}")
    return out


def clip_state_from_transformers(state: dict[str, torch.Tensor], cfg: ClipVisionConfig) -> dict[str, torch.Tensor]:
    """A transformers CLIPVisionModel(WithProjection) state dict -> ours: the `vision_model.` prefix of
    older checkpoints dropped, the CLIP_UNUSED_TRANSFORMERS keys left out (the rest is checked by the loader)."""
    out = {}
    for k, v in state.items():
        k = k.removeprefix("vision_model.")
        if k.startswith(CLIP_UNUSED_TRANSFORMERS):
            continue
        if _later_layer(k, "encoder.layers.", cfg.run_layers):
            continue
        out[k] = v
    return out


def clip_config_from_transformers(c: dict, *, feature_layer: int = -2) -> ClipVisionConfig:
    """A `ClipVisionConfig` from a transformers CLIPVisionConfig's config.json dict (or a CLIPConfig's).

    Raises:
        WeightsError: an activation other than exact GELU, or not 3 input channels.
    """
    c = c.get("vision_config", c)
    if c.get("hidden_act", "quick_gelu") != "gelu":
        raise WeightsError(f"hidden_act {c.get('hidden_act', 'quick_gelu')!r}: the release's tower uses 'gelu'")
    if int(c.get("num_channels", 3)) != 3:
        raise WeightsError(f"num_channels {c['num_channels']}: the encoder takes RGB")
    return ClipVisionConfig(
        width=int(c["hidden_size"]), layers=int(c["num_hidden_layers"]), heads=int(c["num_attention_heads"]),
        mlp_dim=int(c["intermediate_size"]), image_size=int(c["image_size"]), patch_size=int(c["patch_size"]),
        eps=float(c.get("layer_norm_eps", 1e-5)), feature_layer=feature_layer,
    )  # fmt: skip


def load_image_encoder(
    path: str | Path, cfg: ClipVisionConfig | None = None, *,
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> ClipImageEncoder:
    """The CLIP vision tower from the release's `.pth` or a transformers folder.

    Args:
        path: the release's CLIP `.pth` (a file, or a folder holding `CLIP_FILE`), or a
            transformers folder (`image_encoder/` inside it, or that folder itself:
            config.json and model*.safetensors).
        cfg: sizes for a `.pth` (default: ViT-H/14, penultimate layer); a folder's config.json wins.

    Raises:
        WeightsError: missing/unexpected keys (named), misshapen ones, an unsupported config.
        FileNotFoundError: nothing at `path`.
    """
    path = Path(path)
    if path.is_dir() and (path / CLIP_FILE).is_file():
        path = path / CLIP_FILE
    if path.is_file():
        cfg = cfg or ClipVisionConfig()
        state = clip_state_from_original(read_checkpoint(path), cfg, what=str(path))
    elif path.is_dir():
        folder = path / "image_encoder" if (path / "image_encoder").is_dir() else path
        cfg = clip_config_from_transformers(read_config(folder))
        state = clip_state_from_transformers(read_safetensors_dir(folder), cfg)
    else:
        raise FileNotFoundError(path)
    enc = ClipImageEncoder(cfg, init_weights=False).to(dtype)  # every parameter is loaded below
    load_state_strict(enc.model, state, what=str(path))
    return enc.to(dtype=dtype, device=device).eval()
