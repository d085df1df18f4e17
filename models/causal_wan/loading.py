"""Loading a causal Wan model: the DiT from its checkpoint, the VAE decoder and umT5 from a base folder.

What a user brings, and what reads it:

| weights | DiT | VAE + umT5 from |
|---|---|---|
| a diffusers folder (`transformer/ vae/ text_encoder/ tokenizer/`) | `transformer/` | the same folder |
| a Self-Forcing / CausVid / LongLive `.pt` (`generator`, `generator_ema`) | the `.pt` (+ LoRA) | `base_folder` |

`base_folder` is either a diffusers folder (Wan2.1-T2V-1.3B-Diffusers) or Wan
2.1's own release folder, which the references read (Wan-AI/Wan2.1-T2V-1.3B:
`Wan2.1_VAE.pth`, `models_t5_umt5-xxl-enc-bf16.pth`, `google/umt5-xxl/`;
Self-Forcing `utils/wan_wrapper.py`). Every key must be used and every
parameter filled: a missing or unexpected key raises `WeightsError` naming it.
Nothing here downloads anything.

The DiT is built on the meta device and takes the checkpoint's tensors (cast
to the serving dtype), so a 1.3 B model is never held twice in memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from worldcast.models.causal_wan.checkpoints import (
    diffusers_dit_state,
    diffusers_transformer_sizes,
    dit_sizes,
    generator_names,
    load_state_strict,
    original_dit_state,
    read_config,
    read_pt,
    read_safetensors_dir,
)
from worldcast.models.causal_wan.config import CausalWanConfig, WanVAEConfig
from worldcast.models.causal_wan.dit import CausalWanDiT, param_dtype
from worldcast.models.causal_wan.keys import (  # re-exported: the names callers used to import from here
    DIT_KEY_TABLE,
    WeightsError,
    diffusers_to_original,
    original_to_diffusers,
    wan_vae_to_diffusers,
)
from worldcast.models.causal_wan.lora import merge_lora, read_lora
from worldcast.models.causal_wan.text import TextEncoder
from worldcast.models.causal_wan.vae import WanVAEDecoder

log = logging.getLogger(__name__)

__all__ = [
    "DIT_KEY_TABLE", "WeightsError", "diffusers_to_original", "original_to_diffusers", "load_state_strict",
    "CausalWanParts", "load_parts", "load_dit_pt", "tiny_parts", "build_dit", "base_layout", "load_vae", "load_text",
    "original_dit_state", "vae_config_from_diffusers", "read_config", "read_safetensors_dir",
]  # fmt: skip

#: Wan 2.1's own release files (Wan-AI/Wan2.1-T2V-1.3B), as Self-Forcing's wan_wrapper.py reads them.
WAN_VAE_FILE = "Wan2.1_VAE.pth"
WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_TOKENIZER_DIR = "google/umt5-xxl"


def build_dit(cfg: CausalWanConfig, state: dict[str, torch.Tensor], *, dtype: torch.dtype,
              device: str | torch.device, what: str) -> CausalWanDiT:
    """A `CausalWanDiT` holding `state` (original names), cast to `dtype` (time MLPs and modulation kept
    float32 under a half type, `dit.FP32_PARAMS`), on `device`.

    Raises:
        WeightsError: missing / unexpected / misshapen keys (named).
    """
    with torch.device("meta"):
        dit = CausalWanDiT(cfg)
    load_state_strict(dit, {k: v.to(param_dtype(k, dtype)) for k, v in state.items()}, what=what, assign=True)
    return dit.to(device).eval()


def load_dit_pt(path: str | Path, cfg: CausalWanConfig, *, ema: bool = False, lora: str | Path | None = None,
                lora_alpha: float | None = None, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> CausalWanDiT:
    """Only the DiT of a Self-Forcing-layout `.pt` (optionally with a LoRA merged), built for `cfg`.

    Raises:
        WeightsError: missing/unexpected/misshapen keys (named), or a bad layout. FileNotFoundError: no file.
    """
    state = original_dit_state(read_pt(path), ema=ema)
    if lora is not None:
        state = merge_lora(state, read_lora(lora), alpha=lora_alpha)
    return build_dit(cfg, state, dtype=dtype, device=device, what=str(path))


# -----------------------------------------------------------------------------
# base folders: VAE and umT5


def base_layout(folder: str | Path) -> str:
    """"diffusers" (vae/config.json) or "wan" (Wan2.1_VAE.pth beside the umT5 file).

    Raises:
        FileNotFoundError: no such folder. WeightsError: neither layout.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(root)
    if (root / "vae" / "config.json").is_file():
        return "diffusers"
    if (root / WAN_VAE_FILE).is_file():
        return "wan"
    raise WeightsError(f"{root}: neither a diffusers folder (vae/config.json) nor Wan 2.1's release folder "
                       f"({WAN_VAE_FILE}, {WAN_T5_FILE}, {WAN_TOKENIZER_DIR}/)")


def wan_vae_config(shapes: dict[str, tuple[int, ...]], default: WanVAEConfig) -> WanVAEConfig:
    """A Wan VAE file's sizes, read from its decoder's tensor shapes (the file has no config).

    Wan 2.1's Decoder3d (`wan/modules/vae.py`): `decoder.conv1` -> base * dim_mult[-1] channels, then per
    stage `num_res_blocks + 1` residual blocks (`residual.2`: the stage's width base * dim_mult reversed)
    and a Resample (with a `time_conv` when it upsamples time) between stages; `conv2` is z_dim wide.
    dim_mult[0] is taken as 1 (Wan 2.1: [1, 2, 4, 4]). The latent statistics are not in the file:
    `default`'s when its z_dim matches (Wan 2.1's, as the references' WanVAEWrapper hard-codes), else 0 / 1.

    Raises:
        WeightsError: not a Wan VAE decoder.
    """
    import re

    try:
        z = shapes["conv2.weight"][0]
    except KeyError:
        raise WeightsError("not a Wan VAE file (no conv2.weight)") from None
    stages: list[list[int]] = [[]]
    temporal: list[bool] = []
    entries = sorted({int(m[1]) for k in shapes if (m := re.match(r"^decoder\.upsamples\.(\d+)\.", k))})
    for n in entries:
        if f"decoder.upsamples.{n}.resample.1.weight" in shapes:
            temporal.append(f"decoder.upsamples.{n}.time_conv.weight" in shapes)
            stages.append([])
        elif f"decoder.upsamples.{n}.residual.2.weight" in shapes:
            stages[-1].append(shapes[f"decoder.upsamples.{n}.residual.2.weight"][0])
        else:
            raise WeightsError(f"decoder.upsamples.{n} is neither a residual block nor a resample (attention in "
                               "the up path is not Wan 2.1's VAE)")
    if not stages[-1] or len({len(st) for st in stages}) != 1:
        raise WeightsError("the Wan VAE's up stages do not all have the same number of residual blocks")
    base = stages[-1][-1]
    dim_mult = tuple(st[-1] // base for st in reversed(stages))
    same_z = default.z_dim == z
    return WanVAEConfig(base_dim=base, z_dim=z, dim_mult=dim_mult, num_res_blocks=len(stages[0]) - 1,
                        temporal_downsample=tuple(reversed(temporal)),
                        latents_mean=default.latents_mean if same_z else (0.0,) * z,
                        latents_std=default.latents_std if same_z else (1.0,) * z)


def vae_config(folder: str | Path, default: WanVAEConfig | None = None) -> WanVAEConfig:
    """The VAE's sizes: diffusers' vae/config.json, or read from the tensors of Wan's own file
    (`wan_vae_config`, latent statistics from `default`, Wan 2.1's unless given).

    Raises:
        WeightsError: the Wan 2.2 VAE, or an unreadable config.
    """
    root = Path(folder)
    if base_layout(root) == "wan":
        return wan_vae_config({k: tuple(v.shape) for k, v in read_pt(root / WAN_VAE_FILE).items()},
                              default or WanVAEConfig())
    v = read_config(root / "vae")
    if v.get("is_residual") or v.get("patch_size"):
        raise WeightsError("the Wan 2.2 VAE (is_residual / patch_size) is not supported")
    return vae_config_from_diffusers(v)


def vae_config_from_diffusers(v: dict) -> WanVAEConfig:
    """A `WanVAEConfig` from an `AutoencoderKLWan` config.json's dict (already checked to be Wan 2.1)."""
    return WanVAEConfig(
        base_dim=int(v.get("decoder_base_dim") or v["base_dim"]), z_dim=int(v["z_dim"]),
        dim_mult=tuple(v["dim_mult"]), num_res_blocks=int(v["num_res_blocks"]),
        temporal_downsample=tuple(v["temperal_downsample"]),
        latents_mean=tuple(float(x) for x in v["latents_mean"]),
        latents_std=tuple(float(x) for x in v["latents_std"]),
    )  # fmt: skip


def vae_state(folder: str | Path, cfg: WanVAEConfig) -> dict[str, torch.Tensor]:
    """The decoder's weights (diffusers names; the encoder side dropped) from either layout."""
    root = Path(folder)
    if base_layout(root) == "wan":
        raw = read_pt(root / WAN_VAE_FILE)
        return {name: v for k, v in raw.items() if (name := wan_vae_to_diffusers(k, cfg)) is not None}
    raw = read_safetensors_dir(root / "vae")
    return {k: v for k, v in raw.items() if not k.startswith(("encoder.", "quant_conv."))}


def load_vae(folder: str | Path, cfg: WanVAEConfig, *, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> WanVAEDecoder:
    """A `WanVAEDecoder` from a base folder of either layout.

    Raises:
        WeightsError: missing/unexpected decoder keys (named) or misshapen ones.
    """
    vae = WanVAEDecoder(cfg)
    load_state_strict(vae, vae_state(folder, cfg), what=f"{folder} (VAE)")
    return vae.to(dtype=dtype, device=device).eval()


def base_heads(folder: str | Path) -> int | None:
    """Attention heads of the base model's transformer config, if the folder has one (Wan's config.json
    `num_heads`, diffusers' transformer/config.json `num_attention_heads`): a `.pt` does not say."""
    root = Path(folder)
    for path, key in ((root / "config.json", "num_heads"), (root / "transformer" / "config.json",
                                                             "num_attention_heads")):
        if path.is_file():
            import json

            value = json.loads(path.read_text()).get(key)
            if value:
                return int(value)
    return None


def load_text(folder: str | Path, *, text_len: int, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu") -> TextEncoder:
    """The umT5 prompt encoder from a base folder of either layout."""
    root = Path(folder)
    if base_layout(root) == "wan":
        return TextEncoder.from_wan_checkpoint(root / WAN_T5_FILE, root / WAN_TOKENIZER_DIR, text_len=text_len,
                                               dtype=dtype, device=device)
    return TextEncoder.from_pretrained(root, text_len=text_len, dtype=dtype, device=device)


# -----------------------------------------------------------------------------
# Everything a server needs


@dataclass
class CausalWanParts:
    """A loaded causal Wan model: config, DiT, VAE decoder and prompt encoder (all stateless across sessions).

    Attributes:
        source: how the weights were read, for logs and the dry run (layouts, EMA or not, LoRA).
    """

    cfg: CausalWanConfig
    dit: CausalWanDiT
    vae: WanVAEDecoder
    text: TextEncoder
    source: str = ""


def choose_generator(ckpt: dict, ema: bool | None, *, default_ema: bool, path: Path) -> bool:
    """Whether to read `generator_ema` from a `.pt`: as asked, else the preset's default where present.

    Raises:
        WeightsError: EMA weights asked for (`ema=True`) and the checkpoint has none, or no generator at all.
    """
    names = generator_names(ckpt)
    if ema is True and "generator_ema" not in names:
        raise WeightsError(f"{path} has no EMA weights (generator_ema); it holds {names or sorted(ckpt)[:10]}")
    if ema is None:
        ema = default_ema and "generator_ema" in names
        if default_ema and not ema:
            log.warning("causal-wan: %s has no generator_ema; serving its generator weights", path)
    return ema


def load_parts(
    weights: str | Path, *, cfg: CausalWanConfig | None = None, base_folder: str | Path | None = None,
    ema: bool | None = False, default_ema: bool = False, lora: str | Path | None = None,
    lora_alpha: float | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> CausalWanParts:
    """Load from a diffusers folder, or from a `.pt` (+ an optional LoRA) plus a base folder.

    Args:
        weights: a diffusers folder, or a `.pt` (`generator` / `generator_ema`).
        cfg: causal settings (a preset's config; default Wan 2.1 1.3B with Self-Forcing's sampling);
            the network sizes come from the weights.
        base_folder: for a `.pt`: the diffusers or Wan 2.1 release folder with the VAE and umT5.
        ema: take `generator_ema` (True), `generator` (False), or the preset's choice (None: `default_ema`
            where the checkpoint has EMA weights).
        lora: a PEFT LoRA file (LongLive's `lora.pt`) merged into the DiT (`lora.merge_lora`).
        lora_alpha: the LoRA's alpha (None: its rank, i.e. scale 1, as LongLive's config).
        dtype: DiT, VAE and umT5 weight dtype (bf16 on CUDA; see `dit.param_dtype`).

    Raises:
        WeightsError: a bad checkpoint (keys named). FileNotFoundError: a missing path.
    """
    path = Path(weights)
    base = cfg or CausalWanConfig()
    if path.is_dir():
        folder = path
        if lora is not None:
            raise WeightsError("a LoRA merges into a .pt generator, not into a diffusers folder")
        sizes = diffusers_transformer_sizes(folder)
        state = diffusers_dit_state(folder)
        source = f"diffusers folder {folder}"
    elif path.is_file():
        if base_folder is None:
            raise WeightsError(f"{path} holds the DiT only: pass the base folder (--wan-base) for the VAE and umT5")
        folder = Path(base_folder)
        ckpt = read_pt(path)
        use_ema = choose_generator(ckpt, ema, default_ema=default_ema, path=path)
        state = original_dit_state(ckpt, ema=use_ema)
        source = f"{path} ({'generator_ema' if use_ema else 'generator'})"
        if lora is not None:
            state = merge_lora(state, read_lora(lora), alpha=lora_alpha)
            source += f" + LoRA {lora}"
        sizes = dit_sizes({k: tuple(v.shape) for k, v in state.items()}, base_heads(folder) or base.heads)
        source += f", VAE and umT5 from {base_layout(folder)} folder {folder}"
    else:
        raise FileNotFoundError(path)
    cfg = replace(base, vae=vae_config(folder, base.vae), **sizes)  # type: ignore[arg-type]
    dit = build_dit(cfg, state, dtype=dtype, device=device, what=str(path))
    del state
    vae = load_vae(folder, cfg.vae, dtype=dtype, device=device)
    text = load_text(folder, text_len=cfg.text_len, dtype=dtype, device=device)
    if text.dim != cfg.text_dim:
        raise WeightsError(f"text encoder width {text.dim} != transformer text_dim {cfg.text_dim}")
    log.info("causal-wan: loaded %s (%.3f B DiT parameters)", source, dit.num_params() / 1e9)
    return CausalWanParts(cfg=cfg, dit=dit, vae=vae, text=text, source=source)


def tiny_parts(
    *, cfg: CausalWanConfig | None = None, seed: int = 0, dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> CausalWanParts:
    """RANDOM-WEIGHT tiny model (`config.tiny()`): runs the whole path anywhere, makes noise-like video."""
    from worldcast.models.causal_wan.config import tiny

    cfg = cfg or tiny()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dit = CausalWanDiT(cfg)
        vae = WanVAEDecoder(cfg.vae)
    text = TextEncoder.tiny_random(dim=cfg.text_dim, text_len=cfg.text_len, seed=seed)
    log.warning("causal-wan:tiny has random weights: its video is noise-like")
    return CausalWanParts(
        cfg=cfg, dit=dit.cast(dtype).to(device).eval(), vae=vae.to(dtype=dtype, device=device).eval(),
        text=TextEncoder(text.model.to(device), text.tokenizer, text_len=cfg.text_len), source="random (tiny)",
    )
