"""Loading the released Matrix-Game 2.0 DiT checkpoints through one explicit key table.

The release (Hugging Face `Skywork/Matrix-Game-2.0`, as its README downloads it)
holds one DiT per variant, saved from `WanDiffusionWrapper` (so every key starts
with `model.`; `inference.py` loads them with `load_state_dict`, strict):

| variant | file | config (the code repo's `configs/distilled_model/...`) |
|---|---|---|
| universal | `base_distilled_model/base_distill.safetensors` | `universal/config.json` |
| gta-drive | `gta_distilled_model/gta_keyboard2dim.safetensors` | `gta_drive/config.json` |
| templerun | `templerun_distilled_model/templerun_7dim_onlykey.safetensors` | `templerun/config.json` |

beside `Wan2.1_VAE.pth` (VAE encoder and decoder) and the CLIP vision tower
(`models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`), which the encoder
modules load. A variant folder may hold the release's `config.json`; it is read
and must agree with the preset. Every key of the file must map to a parameter
and every parameter must be filled: a missing, unexpected or misshapen key raises
`WeightsError` naming it. Nothing here downloads anything.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from worldcast.models.causal_wan.loading import WeightsError, load_state_strict, load_vae
from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.matrix_game.conditioning import ImageEncoders, fake_encoders
from worldcast.models.matrix_game.config import PRESETS, MatrixGameConfig, tiny
from worldcast.models.matrix_game.dit import MatrixGameDiT

log = logging.getLogger(__name__)

#: the prefix of every key in the release's DiT files (`WanDiffusionWrapper.model`)
RELEASE_PREFIX = "model."

#: variant -> (folder, file) in the release's download
VARIANT_FILES: dict[str, tuple[str, str]] = {
    "universal": ("base_distilled_model", "base_distill.safetensors"),
    "gta-drive": ("gta_distilled_model", "gta_keyboard2dim.safetensors"),
    "templerun": ("templerun_distilled_model", "templerun_7dim_onlykey.safetensors"),
}

#: ours (`MatrixGameDiT`) <-> the release's `CausalWanModel` (after `RELEASE_PREFIX`).
#: `{i}` is a block index; each row covers `.weight` and `.bias` (or the bare parameter).
DIT_KEY_TABLE: tuple[tuple[str, str], ...] = (
    ("patch_embedding", "patch_embedding"),
    ("time_embedding.0", "time_embedding.0"),
    ("time_embedding.2", "time_embedding.2"),
    ("time_projection.1", "time_projection.1"),
    ("img_emb.proj.0", "img_emb.proj.0"),  # LayerNorm(1280)
    ("img_emb.proj.1", "img_emb.proj.1"),
    ("img_emb.proj.3", "img_emb.proj.3"),
    ("img_emb.proj.4", "img_emb.proj.4"),  # LayerNorm(dim)
    ("blocks.{i}.self_attn.q", "blocks.{i}.self_attn.q"),
    ("blocks.{i}.self_attn.k", "blocks.{i}.self_attn.k"),
    ("blocks.{i}.self_attn.v", "blocks.{i}.self_attn.v"),
    ("blocks.{i}.self_attn.o", "blocks.{i}.self_attn.o"),
    ("blocks.{i}.self_attn.norm_q", "blocks.{i}.self_attn.norm_q"),
    ("blocks.{i}.self_attn.norm_k", "blocks.{i}.self_attn.norm_k"),
    ("blocks.{i}.norm3", "blocks.{i}.norm3"),
    ("blocks.{i}.cross_attn.q", "blocks.{i}.cross_attn.q"),
    ("blocks.{i}.cross_attn.k", "blocks.{i}.cross_attn.k"),
    ("blocks.{i}.cross_attn.v", "blocks.{i}.cross_attn.v"),
    ("blocks.{i}.cross_attn.o", "blocks.{i}.cross_attn.o"),
    ("blocks.{i}.cross_attn.norm_q", "blocks.{i}.cross_attn.norm_q"),
    ("blocks.{i}.cross_attn.norm_k", "blocks.{i}.cross_attn.norm_k"),
    ("blocks.{i}.ffn.0", "blocks.{i}.ffn.0"),
    ("blocks.{i}.ffn.2", "blocks.{i}.ffn.2"),
    ("blocks.{i}.modulation", "blocks.{i}.modulation"),
    # the action module (blocks in action_config.blocks)
    ("blocks.{i}.action_model.keyboard_embed.0", "blocks.{i}.action_model.keyboard_embed.0"),
    ("blocks.{i}.action_model.keyboard_embed.2", "blocks.{i}.action_model.keyboard_embed.2"),
    ("blocks.{i}.action_model.mouse_mlp.0", "blocks.{i}.action_model.mouse_mlp.0"),
    ("blocks.{i}.action_model.mouse_mlp.2", "blocks.{i}.action_model.mouse_mlp.2"),
    ("blocks.{i}.action_model.mouse_mlp.3", "blocks.{i}.action_model.mouse_mlp.3"),  # LayerNorm(c)
    ("blocks.{i}.action_model.t_qkv", "blocks.{i}.action_model.t_qkv"),
    ("blocks.{i}.action_model.img_attn_q_norm", "blocks.{i}.action_model.img_attn_q_norm"),  # gain unused
    ("blocks.{i}.action_model.img_attn_k_norm", "blocks.{i}.action_model.img_attn_k_norm"),  # gain unused
    ("blocks.{i}.action_model.proj_mouse", "blocks.{i}.action_model.proj_mouse"),
    ("blocks.{i}.action_model.key_attn_q_norm", "blocks.{i}.action_model.key_attn_q_norm"),  # gain unused
    ("blocks.{i}.action_model.key_attn_k_norm", "blocks.{i}.action_model.key_attn_k_norm"),  # gain unused
    ("blocks.{i}.action_model.mouse_attn_q", "blocks.{i}.action_model.mouse_attn_q"),
    ("blocks.{i}.action_model.keyboard_attn_kv", "blocks.{i}.action_model.keyboard_attn_kv"),
    ("blocks.{i}.action_model.proj_keyboard", "blocks.{i}.action_model.proj_keyboard"),
    ("head.head", "head.head"),
    ("head.modulation", "head.modulation"),
)


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(pattern).replace(re.escape("{i}"), r"(\d+)") + r"(\.weight|\.bias)?$")


_TABLE = [(_rx(ours), ours, _rx(theirs), theirs) for ours, theirs in DIT_KEY_TABLE]


def _map(key: str, *, to_release: bool) -> str:
    for rx_o, ours, rx_t, theirs in _TABLE:
        m = (rx_o if to_release else rx_t).match(key)
        if m:
            *idx, suffix = m.groups()
            name = theirs if to_release else ours
            return (name.replace("{i}", idx[0]) if idx else name) + (suffix or "")
    raise WeightsError(f"unexpected key {key!r}: no row of DIT_KEY_TABLE matches it")


def ours_to_release(key: str) -> str:
    """Our parameter name -> the release's key (with `RELEASE_PREFIX`). Raises WeightsError if no row matches."""
    return RELEASE_PREFIX + _map(key, to_release=True)


def release_to_ours(key: str) -> str:
    """A release key (with or without `RELEASE_PREFIX`) -> our parameter name. Raises WeightsError if none matches."""
    return _map(key.removeprefix(RELEASE_PREFIX), to_release=False)


def expected_release_keys(cfg: MatrixGameConfig) -> dict[str, tuple[int, ...]]:
    """The release keys a checkpoint of `cfg` must hold, with their shapes (built on the meta device)."""
    with torch.device("meta"):
        dit = MatrixGameDiT(cfg)
    return {ours_to_release(k): tuple(v.shape) for k, v in dit.state_dict().items()}


def release_state(raw: dict[str, torch.Tensor], cfg: MatrixGameConfig, *, what: str) -> dict[str, torch.Tensor]:
    """Our state dict from a release checkpoint's tensors, every key checked against `cfg`.

    Raises:
        WeightsError: keys without the release prefix, unexpected keys (those no table row
            maps, or rows of blocks/branches `cfg` has not), missing keys, misshapen tensors;
            each named (the first 10 of a kind).
    """
    bare = [k for k in raw if not k.startswith(RELEASE_PREFIX)]
    if bare and len(bare) != len(raw):
        raise WeightsError(f"{what}: keys {bare[:10]} lack the release's {RELEASE_PREFIX!r} prefix the others have")
    keys = {(k if k.startswith(RELEASE_PREFIX) else RELEASE_PREFIX + k): k for k in raw}
    want = expected_release_keys(cfg)
    unexpected = sorted(set(keys) - set(want))
    missing = sorted(set(want) - set(keys))
    if unexpected or missing:
        raise WeightsError(f"{what}: unexpected keys {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}, "
                           f"missing keys {missing[:10]}{' ...' if len(missing) > 10 else ''} "
                           f"(config: {cfg.layers} blocks, action blocks {cfg.action.blocks if cfg.action else ()})")
    out = {}
    for k, src in keys.items():
        t = raw[src]
        if tuple(t.shape) != want[k]:
            raise WeightsError(f"{what}: {k} has shape {tuple(t.shape)}, the config needs {want[k]}")
        out[release_to_ours(k)] = t
    return out


# -----------------------------------------------------------------------------
# Files


def read_release_config(path: str | Path) -> MatrixGameConfig:
    """A config from the release's `config.json` (network and action module; rollout from the preset defaults)."""
    return MatrixGameConfig.from_release(json.loads(Path(path).read_text()))


def _same_network(a: MatrixGameConfig, b: MatrixGameConfig) -> list[str]:
    fields = ("dim", "ffn_dim", "freq_dim", "heads", "layers", "in_channels", "out_channels", "eps",
              "local_attn_size", "sink_size", "action")
    return [f for f in fields if getattr(a, f) != getattr(b, f)]


def variant_file(weights: str | Path, variant: str) -> Path:
    """The DiT file of `variant` under a release download folder (or `weights` itself if it is a file).

    Raises:
        ValueError: an unknown variant. FileNotFoundError: the file is not there.
    """
    p = Path(weights)
    if p.is_file():
        return p
    if variant not in VARIANT_FILES:
        raise ValueError(f"unknown Matrix-Game 2.0 variant {variant!r}; known: {sorted(VARIANT_FILES)}")
    folder, name = VARIANT_FILES[variant]
    f = p / folder / name
    if not f.is_file():
        raise FileNotFoundError(f"{f} (the release's {variant} DiT: huggingface-cli download Skywork/Matrix-Game-2.0)")
    return f


def load_dit(weights: str | Path, variant: str, *, cfg: MatrixGameConfig | None = None,
             dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
             ) -> tuple[MatrixGameConfig, MatrixGameDiT]:
    """The DiT of a variant from the release's files.

    Args:
        weights: the release download folder, or a variant's `.safetensors` directly.
        variant: "universal", "gta-drive" or "templerun" (picks the file and the preset).
        cfg: the config (default: the variant's preset). A `config.json` beside the file is read
            and must agree with it on the network and action module.
        dtype: weight dtype (bf16 on a GPU; time MLPs and modulation stay float32).

    Raises:
        WeightsError: a key missing, unexpected or misshapen (named), or a config.json that disagrees.
        FileNotFoundError, ValueError: see `variant_file`.
    """
    f = variant_file(weights, variant)
    cfg = cfg or PRESETS[variant]()
    beside = f.parent / "config.json"
    if beside.is_file():
        diff = _same_network(read_release_config(beside), cfg)
        if diff:
            raise WeightsError(f"{beside} disagrees with the {variant} preset on {diff}")
    state = release_state(load_file(str(f)), cfg, what=str(f))
    dit = empty_dit(cfg, dtype=dtype, device=device)
    load_state_strict(dit, state, what=str(f))  # each tensor converted once, file dtype -> parameter dtype
    log.info("matrix-game-2: loaded %s (%.3f B DiT parameters)", f, dit.num_params() / 1e9)
    return cfg, dit.eval()


def empty_dit(cfg: MatrixGameConfig, *, dtype: torch.dtype, device: str | torch.device) -> MatrixGameDiT:
    """A DiT whose parameters are made in their final dtype and device, uninitialised, for a checkpoint to fill.

    Built on the meta device and cast there (`MatrixGameDiT.cast`: float32 time MLPs and modulation under half
    types), so a weight goes from the file's dtype to its own in one conversion: a float64 file loads into a
    float64 model bit for bit, never through the default dtype (building in float32, copying, then casting
    rounded every weight through float32: 5.8e-8 relative at worst, issue 31). The DiT keeps no buffers, so
    nothing computed at construction is lost by `to_empty`.

    Args:
        dtype: the weights' dtype. device: where they live.
    """
    with torch.device("meta"):
        dit = MatrixGameDiT(cfg)
    assert not list(dit.buffers()), "MatrixGameDiT grew buffers: to_empty would leave them uninitialised"
    return dit.cast(dtype).to_empty(device=device)


# -----------------------------------------------------------------------------
# Everything a server needs


@dataclass
class MatrixGameParts:
    """A loaded model: config, DiT, VAE decoder, image encoders (all stateless across sessions)."""

    cfg: MatrixGameConfig
    dit: MatrixGameDiT
    vae: WanVAEDecoder
    encoders: ImageEncoders


def load_parts(weights: str | Path, variant: str, *, encoders: ImageEncoders, vae: WanVAEDecoder | None = None,
               dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> MatrixGameParts:
    """A variant's DiT from the release's files, with the given image encoders and VAE decoder.

    Args:
        weights, variant, dtype, device: as `load_dit`.
        encoders: the VAE encoder + CLIP (`conditioning.ImageEncoders`), loaded by the encoder modules.
        vae: the VAE decoder; default: from a diffusers-format `vae/` folder under `weights`
            (the release's `Wan2.1_VAE.pth` is read by the encoder modules' loader).

    Raises:
        WeightsError: as `load_dit`, or no decoder to be had.
    """
    cfg, dit = load_dit(weights, variant, dtype=dtype, device=device)
    if vae is None:
        folder = Path(weights)
        if not (folder / "vae" / "config.json").is_file():
            raise WeightsError(f"{folder}: no VAE decoder given and no diffusers-format vae/ folder; the release's "
                               "Wan2.1_VAE.pth is read by the encoder modules' loader")
        vae = load_vae(folder, cfg.vae, dtype=dtype, device=device)
    return MatrixGameParts(cfg=cfg, dit=dit, vae=vae, encoders=encoders)


def tiny_parts(*, cfg: MatrixGameConfig | None = None, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> MatrixGameParts:
    """RANDOM-WEIGHT tiny model (`config.tiny()`) with FAKE image encoders: the whole path, noise-like video."""
    cfg = cfg or tiny()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dit = MatrixGameDiT(cfg)
        vae = WanVAEDecoder(cfg.vae)
    log.warning("matrix-game-2:tiny has random weights and fake image encoders: its video is noise-like")
    enc = fake_encoders(latent_channels=cfg.out_channels, image_tokens=cfg.image_tokens, image_dim=cfg.image_dim,
                        seed=seed)
    return MatrixGameParts(cfg=cfg, dit=dit.cast(dtype).to(device).eval(),
                           vae=vae.to(dtype=dtype, device=device).eval(), encoders=enc)
