"""Reading a causal Wan DiT's weights from the layouts they are published in.

- Self-Forcing / CausVid / LongLive `.pt`: `{"generator": {...}, "generator_ema": {...}}`
  (either may be missing), keys `model.<original name>`; EMA keys may carry FSDP's
  `_fsdp_wrapped_module.` (Self-Forcing `inference.py`, CausVid
  `minimal_inference/autoregressive_inference.py`, LongLive `inference.py`).
- diffusers folder: `transformer/config.json` + `diffusion_pytorch_model*.safetensors`,
  diffusers names (mapped through `keys.DIT_KEY_TABLE`).

`dit_sizes` reads the network's sizes from the tensors themselves, so a `.pt`
(which carries no config) is built with the shapes it holds; anything else
that does not fit is refused by `load_state_strict`, naming the key.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from worldcast.models.causal_wan.keys import WeightsError, diffusers_to_original

log = logging.getLogger(__name__)


def load_state_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], *, what: str,
                      assign: bool = False) -> None:
    """Copy `state` into `module`, refusing missing, unexpected or misshapen keys (named in the error).

    Args:
        assign: keep the given tensors instead of copying (`load_state_dict(assign=True)`; e.g. into a
            module built on the meta device).
    """
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
    if assign:  # the tensors are kept as given (dtype included)
        module.load_state_dict(state, strict=True, assign=True)
    else:
        module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


# -----------------------------------------------------------------------------
# .pt


def read_pt(path: str | Path) -> dict:
    """A training checkpoint, memory-mapped (tensors are read when used).

    Raises:
        FileNotFoundError: no such file. WeightsError: not a dict.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(p)
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # a legacy (non-zip) file cannot be memory-mapped
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict):
        raise WeightsError(f"{p}: a checkpoint dict was expected, got {type(ckpt).__name__}")
    return ckpt


def generator_names(ckpt: dict) -> list[str]:
    """Which of `generator` / `generator_ema` a checkpoint holds."""
    return [n for n in ("generator", "generator_ema") if isinstance(ckpt.get(n), dict)]


def original_dit_state(ckpt: dict, *, ema: bool = False) -> dict[str, torch.Tensor]:
    """The DiT's state dict (original names) from a Self-Forcing / CausVid / LongLive checkpoint dict.

    Accepts `{"generator": ...}` / `{"generator_ema": ...}` (or `{"model": ...}`),
    keys prefixed `model.` and possibly `_fsdp_wrapped_module.`.

    Raises:
        WeightsError: no such generator state, or a key without the `model.` prefix.
    """
    name = "generator_ema" if ema else "generator"
    if isinstance(ckpt.get(name), dict):
        raw = ckpt[name]
    elif not ema and isinstance(ckpt.get("model"), dict):
        raw = ckpt["model"]
    else:
        raise WeightsError(f"checkpoint has no {name!r} (it holds {generator_names(ckpt) or sorted(ckpt)[:10]})")
    out = {}
    for k, v in raw.items():
        k = k.replace("_fsdp_wrapped_module.", "")
        if not k.startswith("model."):
            raise WeightsError(f"unexpected checkpoint key {k!r}: generator keys start with 'model.'")
        out[k[len("model."):]] = v
    return out


# -----------------------------------------------------------------------------
# diffusers transformer folder


def read_safetensors_dir(folder: Path) -> dict[str, torch.Tensor]:
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


def safetensors_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a folder's `*.safetensors`, read from the headers only (no data)."""
    out: dict[str, tuple[int, ...]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as s:
            for k in s.keys():
                out[k] = tuple(s.get_slice(k).get_shape())
    if not out:
        raise WeightsError(f"{folder}: no .safetensors files")
    return out


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise WeightsError(f"{folder}: no config.json")
    return json.loads(path.read_text())


def diffusers_dit_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """`folder/transformer`'s weights under the original names."""
    return {diffusers_to_original(k): v for k, v in read_safetensors_dir(Path(folder) / "transformer").items()}


def diffusers_transformer_sizes(folder: Path) -> dict[str, object]:
    """The network sizes of `folder/transformer/config.json` (diffusers' keys) as `CausalWanConfig` fields.

    Raises:
        WeightsError: a transformer this module cannot run (image conditioning, other qk norm).
    """
    t = read_config(folder / "transformer")
    if t.get("image_dim") or t.get("added_kv_proj_dim"):
        raise WeightsError("image-conditioned (i2v) transformers are not supported")
    if t.get("qk_norm", "rms_norm_across_heads") not in ("rms_norm_across_heads", None):
        raise WeightsError(f"qk_norm {t['qk_norm']!r} is not supported")
    heads, hd = int(t["num_attention_heads"]), int(t["attention_head_dim"])
    return dict(
        dim=heads * hd, heads=heads, ffn_dim=int(t["ffn_dim"]), freq_dim=int(t["freq_dim"]),
        text_dim=int(t["text_dim"]), layers=int(t["num_layers"]), in_channels=int(t["in_channels"]),
        out_channels=int(t.get("out_channels") or t["in_channels"]), patch=tuple(t["patch_size"]),
        eps=float(t["eps"]), cross_attn_norm=bool(t["cross_attn_norm"]), qk_norm=t.get("qk_norm") is not None,
    )  # fmt: skip


def dit_sizes(shapes: dict[str, tuple[int, ...]], heads: int) -> dict[str, object]:
    """The sizes a DiT state dict (original names -> shapes) implies, as `CausalWanConfig` fields; `heads`
    is kept (the per-head split is not in the shapes: Wan's qk norm spans all heads) unless the width
    does not divide by it (then Wan's head dim, 128).

    Raises:
        WeightsError: keys the sizes are read from are missing (not a Wan DiT).
    """
    try:
        dim, c_in, *patch = shapes["patch_embedding.weight"]
        ffn = shapes["blocks.0.ffn.0.weight"][0]
        text_dim = shapes["text_embedding.0.weight"][1]
        freq_dim = shapes["time_embedding.0.weight"][1]
        c_out = shapes["head.head.weight"][0] // max(1, patch[0] * patch[1] * patch[2])
    except (KeyError, ValueError) as e:
        raise WeightsError(f"not a Wan DiT state dict (cannot read its sizes: {e})") from None
    layers = 1 + max(int(k.split(".")[1]) for k in shapes if k.startswith("blocks."))
    kw: dict[str, object] = dict(dim=dim, ffn_dim=ffn, text_dim=text_dim, freq_dim=freq_dim, layers=layers,
                                 in_channels=c_in, out_channels=c_out, patch=tuple(patch),
                                 cross_attn_norm="blocks.0.norm3.weight" in shapes,
                                 qk_norm="blocks.0.self_attn.norm_q.weight" in shapes)
    kw["heads"] = heads
    if dim % heads:
        kw["heads"] = dim // 128  # Wan 2.1's head dim
        log.warning("causal-wan: width %d does not divide into %d heads; using %d heads of 128", dim, heads,
                    kw["heads"])
    return kw
