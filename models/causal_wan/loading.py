"""Loading causal Wan weights: a diffusers-format folder, or a Self-Forcing / CausVid `.pt`.

One name-mapping table, `DIT_KEY_TABLE`, relates the original Wan /
Self-Forcing parameter names (which `CausalWanDiT` uses) to diffusers'
`WanTransformer3DModel` names. Original checkpoints store the DiT under
`generator` or `generator_ema` with a `model.` prefix (Self-Forcing
`inference.py`; LongLive also strips FSDP's `_fsdp_wrapped_module.`).
Every key must be used and every parameter filled: a missing or unexpected
key raises `WeightsError` naming it. Nothing here downloads anything.

diffusers folder layout (what `save_pretrained` writes):
`transformer/` (config.json, diffusion_pytorch_model*.safetensors),
`vae/` (the same), `text_encoder/` (config.json, model*.safetensors),
`tokenizer/` (tokenizer files).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from worldcast.models.causal_wan.config import CausalWanConfig, WanVAEConfig
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.text import TextEncoder
from worldcast.models.causal_wan.vae import WanVAEDecoder

log = logging.getLogger(__name__)


class WeightsError(ValueError):
    """A checkpoint that does not fit the model: missing, unexpected or misshapen keys, or a bad layout."""


#: original (Wan / Self-Forcing, what CausalWanDiT uses)  <->  diffusers WanTransformer3DModel.
#: `{i}` is the block index; each row covers `.weight` and `.bias` (or the bare parameter).
DIT_KEY_TABLE: tuple[tuple[str, str], ...] = (
    ("patch_embedding", "patch_embedding"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("blocks.{i}.self_attn.q", "blocks.{i}.attn1.to_q"),
    ("blocks.{i}.self_attn.k", "blocks.{i}.attn1.to_k"),
    ("blocks.{i}.self_attn.v", "blocks.{i}.attn1.to_v"),
    ("blocks.{i}.self_attn.o", "blocks.{i}.attn1.to_out.0"),
    ("blocks.{i}.self_attn.norm_q", "blocks.{i}.attn1.norm_q"),
    ("blocks.{i}.self_attn.norm_k", "blocks.{i}.attn1.norm_k"),
    ("blocks.{i}.cross_attn.q", "blocks.{i}.attn2.to_q"),
    ("blocks.{i}.cross_attn.k", "blocks.{i}.attn2.to_k"),
    ("blocks.{i}.cross_attn.v", "blocks.{i}.attn2.to_v"),
    ("blocks.{i}.cross_attn.o", "blocks.{i}.attn2.to_out.0"),
    ("blocks.{i}.cross_attn.norm_q", "blocks.{i}.attn2.norm_q"),
    ("blocks.{i}.cross_attn.norm_k", "blocks.{i}.attn2.norm_k"),
    ("blocks.{i}.norm3", "blocks.{i}.norm2"),  # the affine cross-attention norm (names swap)
    ("blocks.{i}.ffn.0", "blocks.{i}.ffn.net.0.proj"),
    ("blocks.{i}.ffn.2", "blocks.{i}.ffn.net.2"),
    ("blocks.{i}.modulation", "blocks.{i}.scale_shift_table"),
    ("head.head", "proj_out"),
    ("head.modulation", "scale_shift_table"),
)


def _compile_table() -> list[tuple[re.Pattern[str], str, re.Pattern[str], str]]:
    rows = []
    for ours, theirs in DIT_KEY_TABLE:
        def rx(p: str) -> re.Pattern[str]:
            return re.compile("^" + re.escape(p).replace(re.escape("{i}"), r"(\d+)") + r"(\.weight|\.bias)?$")

        rows.append((rx(ours), ours, rx(theirs), theirs))
    return rows


_TABLE = _compile_table()


def diffusers_to_original(key: str) -> str:
    """Map one diffusers DiT key to the original name. Raises WeightsError if no row matches."""
    for _, ours, rx, _theirs in _TABLE:
        m = rx.match(key)
        if m:
            *idx, suffix = m.groups()
            name = ours.replace("{i}", idx[0]) if idx else ours
            return name + (suffix or "")
    raise WeightsError(f"unexpected diffusers transformer key {key!r}: no row of DIT_KEY_TABLE matches it")


def original_to_diffusers(key: str) -> str:
    """Map one original DiT key to diffusers' name. Raises WeightsError if no row matches."""
    for rx, _ours, _, theirs in _TABLE:
        m = rx.match(key)
        if m:
            *idx, suffix = m.groups()
            name = theirs.replace("{i}", idx[0]) if idx else theirs
            return name + (suffix or "")
    raise WeightsError(f"unexpected key {key!r}: no row of DIT_KEY_TABLE matches it")


def load_state_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], *, what: str) -> None:
    """Copy `state` into `module`, refusing missing, unexpected or misshapen keys (named in the error)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise WeightsError(
            f"{what}: missing keys {missing[:10]}{' ...' if len(missing) > 10 else ''}, "
            f"unexpected keys {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}"
        )
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise WeightsError(f"{what}: {k} has shape {tuple(v.shape)}, the model needs {tuple(own[k].shape)}")
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


# -----------------------------------------------------------------------------
# Original Self-Forcing / CausVid .pt


def original_dit_state(ckpt: dict, *, ema: bool = False) -> dict[str, torch.Tensor]:
    """The DiT's state dict (original names) from a Self-Forcing / CausVid / LongLive checkpoint dict.

    Accepts `{"generator": ...}` / `{"generator_ema": ...}` (or `{"model": ...}`),
    keys prefixed `model.` and possibly `_fsdp_wrapped_module.`.

    Raises:
        WeightsError: no generator state, or a key without the `model.` prefix.
    """
    name = "generator_ema" if ema else "generator"
    if name in ckpt:
        raw = ckpt[name]
    elif "model" in ckpt and isinstance(ckpt["model"], dict):
        raw = ckpt["model"]
    else:
        raise WeightsError(f"checkpoint has no {name!r} (keys: {sorted(ckpt)[:10]})")
    out = {}
    for k, v in raw.items():
        k = k.replace("_fsdp_wrapped_module.", "")
        if not k.startswith("model."):
            raise WeightsError(f"unexpected checkpoint key {k!r}: generator keys start with 'model.'")
        out[k[len("model."):]] = v
    return out


def load_dit_pt(path: str | Path, cfg: CausalWanConfig, *, ema: bool = False, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> CausalWanDiT:
    """A `CausalWanDiT` from a Self-Forcing-layout `.pt` (see `original_dit_state`).

    Raises:
        WeightsError: missing/unexpected/misshapen keys (named), or a bad layout.
        FileNotFoundError: no such file.
    """
    ckpt = torch.load(Path(path), map_location="cpu", weights_only=True)
    dit = CausalWanDiT(cfg)
    load_state_strict(dit, original_dit_state(ckpt, ema=ema), what=str(path))
    return dit.cast(dtype).to(device).eval()


# -----------------------------------------------------------------------------
# diffusers folder


def _read_safetensors_dir(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a folder's `*.safetensors` files (sharded or not)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{folder}: no .safetensors files")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            if k in state:
                raise WeightsError(f"{folder}: key {k!r} appears in two shards")
            state[k] = v
    return state


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise WeightsError(f"{folder}: no config.json")
    return json.loads(path.read_text())


def config_from_diffusers(folder: str | Path, base: CausalWanConfig) -> CausalWanConfig:
    """`base` with the network and VAE sizes read from a diffusers folder's config.json files.

    The causal settings (frames_per_chunk, window, sinks, timesteps) are not in
    diffusers' configs and come from `base`.

    Raises:
        WeightsError: a config this module cannot run (image conditioning, Wan 2.2 VAE, other patch).
    """
    root = Path(folder)
    t = _read_config(root / "transformer")
    if t.get("image_dim") or t.get("added_kv_proj_dim"):
        raise WeightsError("image-conditioned (i2v) transformers are not supported")
    if t.get("qk_norm", "rms_norm_across_heads") not in ("rms_norm_across_heads", None):
        raise WeightsError(f"qk_norm {t['qk_norm']!r} is not supported")
    heads, hd = int(t["num_attention_heads"]), int(t["attention_head_dim"])
    kw: dict[str, object] = dict(
        dim=heads * hd, heads=heads, ffn_dim=int(t["ffn_dim"]), freq_dim=int(t["freq_dim"]),
        text_dim=int(t["text_dim"]), layers=int(t["num_layers"]), in_channels=int(t["in_channels"]),
        out_channels=int(t.get("out_channels") or t["in_channels"]), patch=tuple(t["patch_size"]),
        eps=float(t["eps"]), cross_attn_norm=bool(t["cross_attn_norm"]), qk_norm=t.get("qk_norm") is not None,
    )  # fmt: skip
    vae_dir = root / "vae"
    if vae_dir.is_dir():
        v = _read_config(vae_dir)
        if v.get("is_residual") or v.get("patch_size"):
            raise WeightsError("the Wan 2.2 VAE (is_residual / patch_size) is not supported")
        kw["vae"] = vae_config_from_diffusers(v)
    return replace(base, **kw)  # type: ignore[arg-type]


def vae_config_from_diffusers(v: dict) -> WanVAEConfig:
    """A `WanVAEConfig` from an `AutoencoderKLWan` config.json's dict (already checked to be Wan 2.1)."""
    return WanVAEConfig(
        base_dim=int(v.get("decoder_base_dim") or v["base_dim"]), z_dim=int(v["z_dim"]),
        dim_mult=tuple(v["dim_mult"]), num_res_blocks=int(v["num_res_blocks"]),
        temporal_downsample=tuple(v["temperal_downsample"]),
        latents_mean=tuple(float(x) for x in v["latents_mean"]),
        latents_std=tuple(float(x) for x in v["latents_std"]),
    )  # fmt: skip


def load_dit_diffusers(folder: str | Path, cfg: CausalWanConfig, *, dtype: torch.dtype = torch.float32,
                       device: str | torch.device = "cpu") -> CausalWanDiT:
    """A `CausalWanDiT` from `folder/transformer` through `DIT_KEY_TABLE`.

    Raises:
        WeightsError: a key no row maps (named), or missing/misshapen parameters.
    """
    raw = _read_safetensors_dir(Path(folder) / "transformer")
    state = {diffusers_to_original(k): v for k, v in raw.items()}
    dit = CausalWanDiT(cfg)
    load_state_strict(dit, state, what=f"{folder}/transformer")
    return dit.cast(dtype).to(device).eval()


def load_vae_diffusers(folder: str | Path, cfg: WanVAEConfig, *, dtype: torch.dtype = torch.float32,
                       device: str | torch.device = "cpu") -> WanVAEDecoder:
    """A `WanVAEDecoder` from `folder/vae` (its `decoder.*` and `post_quant_conv.*`; the encoder is skipped).

    Raises:
        WeightsError: missing/unexpected decoder keys (named) or misshapen ones.
    """
    raw = _read_safetensors_dir(Path(folder) / "vae")
    encoder_side = ("encoder.", "quant_conv.")
    state = {k: v for k, v in raw.items() if not k.startswith(encoder_side)}
    vae = WanVAEDecoder(cfg)
    load_state_strict(vae, state, what=f"{folder}/vae")
    return vae.to(dtype=dtype, device=device).eval()


# -----------------------------------------------------------------------------
# Everything a server needs


@dataclass
class CausalWanParts:
    """A loaded causal Wan model: config, DiT, VAE decoder and prompt encoder (all stateless across sessions)."""

    cfg: CausalWanConfig
    dit: CausalWanDiT
    vae: WanVAEDecoder
    text: TextEncoder


def load_parts(
    weights: str | Path, *, cfg: CausalWanConfig | None = None, base_folder: str | Path | None = None,
    ema: bool = False, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> CausalWanParts:
    """Load from a diffusers-format folder, or from a Self-Forcing-layout `.pt` plus a diffusers base folder.

    Args:
        weights: a diffusers folder (transformer/, vae/, text_encoder/, tokenizer/) or a `.pt`
            (`generator` / `generator_ema`); a `.pt` takes its VAE and text encoder from `base_folder`
            (e.g. Wan2.1-T2V-1.3B-Diffusers).
        cfg: causal settings and sizes (default `wan_1_3b()`); network sizes are then read from
            the folder's config.json files.
        ema: take `generator_ema` from a `.pt`.
        dtype: DiT and VAE weight dtype (bf16 on CUDA; see `CausalWanDiT.cast`). The text encoder
            uses it too.

    Raises:
        WeightsError: a bad checkpoint (keys named). FileNotFoundError: a missing path.
    """
    from worldcast.models.causal_wan.config import wan_1_3b

    path = Path(weights)
    base = cfg or wan_1_3b()
    if path.is_dir():
        folder = path
    elif path.is_file():
        if base_folder is None:
            raise WeightsError(f"{path} holds the DiT only: pass base_folder= for the VAE and text encoder")
        folder = Path(base_folder)
    else:
        raise FileNotFoundError(path)
    cfg = config_from_diffusers(folder, base)
    if path.is_dir():
        dit = load_dit_diffusers(folder, cfg, dtype=dtype, device=device)
    else:
        dit = load_dit_pt(path, cfg, ema=ema, dtype=dtype, device=device)
    vae = load_vae_diffusers(folder, cfg.vae, dtype=dtype, device=device)
    text = TextEncoder.from_pretrained(folder, text_len=cfg.text_len, dtype=dtype, device=device)
    if text.dim != cfg.text_dim:
        raise WeightsError(f"text encoder width {text.dim} != transformer text_dim {cfg.text_dim}")
    log.info("causal-wan: loaded %s (%.3f B DiT parameters)", path, dit.num_params() / 1e9)
    return CausalWanParts(cfg=cfg, dit=dit, vae=vae, text=text)


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
        text=TextEncoder(text.model.to(device), text.tokenizer, text_len=cfg.text_len),
    )
