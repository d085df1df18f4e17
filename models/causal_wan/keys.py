"""Parameter-name tables between the layouts causal Wan checkpoints come in, and ours.

- DiT: the original Wan / Self-Forcing names (what `CausalWanDiT` uses) and
  diffusers' `WanTransformer3DModel` names (`DIT_KEY_TABLE`).
- VAE: Wan 2.1's own `Wan2.1_VAE.pth` (Wan-Video/Wan2.1 `wan/modules/vae.py`,
  which Self-Forcing, CausVid and LongLive load) and diffusers'
  `AutoencoderKLWan` names (what `WanVAEDecoder` uses): `wan_vae_to_diffusers`.
- umT5: Wan's own `models_t5_umt5-xxl-enc-bf16.pth` (`wan/modules/t5.py`
  `T5Encoder`) and transformers' `UMT5EncoderModel`: `wan_t5_to_transformers`.

Every function raises `WeightsError` naming a key it has no row for, so a
checkpoint of another architecture is refused rather than half loaded.
"""

from __future__ import annotations

import re

from worldcast.models.causal_wan.config import WanVAEConfig


class WeightsError(ValueError):
    """A checkpoint that does not fit the model: missing, unexpected or misshapen keys, or a bad layout."""


# -----------------------------------------------------------------------------
# DiT: original <-> diffusers

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


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(pattern).replace(re.escape("{i}"), r"(\d+)") + r"(\.weight|\.bias)?$")


_TABLE = [(_rx(ours), ours, _rx(theirs), theirs) for ours, theirs in DIT_KEY_TABLE]


def _apply(m: re.Match[str], target: str) -> str:
    *idx, suffix = m.groups()
    return (target.replace("{i}", idx[0]) if idx else target) + (suffix or "")


def diffusers_to_original(key: str) -> str:
    """Map one diffusers DiT key to the original name. Raises WeightsError if no row matches."""
    for _, ours, rx, _theirs in _TABLE:
        if m := rx.match(key):
            return _apply(m, ours)
    raise WeightsError(f"unexpected diffusers transformer key {key!r}: no row of DIT_KEY_TABLE matches it")


def original_to_diffusers(key: str) -> str:
    """Map one original DiT key to diffusers' name. Raises WeightsError if no row matches."""
    for rx, _ours, _, theirs in _TABLE:
        if m := rx.match(key):
            return _apply(m, theirs)
    raise WeightsError(f"unexpected key {key!r}: no row of DIT_KEY_TABLE matches it")


# -----------------------------------------------------------------------------
# VAE decoder: Wan 2.1's Wan2.1_VAE.pth <-> diffusers AutoencoderKLWan

#: Wan's ResidualBlock.residual Sequential indices -> diffusers' names (1, 4 are SiLU, 5 Dropout).
_RESIDUAL = {"residual.0.gamma": "norm1.gamma", "residual.2.weight": "conv1.weight", "residual.2.bias": "conv1.bias",
             "residual.3.gamma": "norm2.gamma", "residual.6.weight": "conv2.weight", "residual.6.bias": "conv2.bias",
             "shortcut.weight": "conv_shortcut.weight", "shortcut.bias": "conv_shortcut.bias"}  # fmt: skip
_ATTENTION = {"norm.gamma", "to_qkv.weight", "to_qkv.bias", "proj.weight", "proj.bias"}
_RESAMPLE = {"resample.1.weight", "resample.1.bias", "time_conv.weight", "time_conv.bias"}


def wan_vae_upsample_layout(cfg: WanVAEConfig) -> list[tuple[int, str]]:
    """Wan's flat `decoder.upsamples.{n}` list as (up block, member): member "resnets.{j}" or "upsamplers.0".

    Wan 2.1's Decoder3d appends, per stage, `num_res_blocks + 1` residual blocks and then (every stage but
    the last) one Resample; Wan 2.1 has no attention in the up path (`attn_scales=[]`).
    """
    out: list[tuple[int, str]] = []
    last = len(cfg.dim_mult) - 1
    for i in range(len(cfg.dim_mult)):
        out += [(i, f"resnets.{j}") for j in range(cfg.num_res_blocks + 1)]
        if i != last:
            out.append((i, "upsamplers.0"))
    return out


def wan_vae_to_diffusers(key: str, cfg: WanVAEConfig) -> str | None:
    """One key of Wan's `Wan2.1_VAE.pth` -> diffusers' name; None for the encoder side (not used here).

    Raises:
        WeightsError: a decoder key with no row (another VAE architecture, e.g. Wan 2.2's).
    """
    if key.startswith(("encoder.", "conv1.")):
        return None  # the encoder and its quant conv
    if key.startswith("conv2."):
        return "post_quant_conv." + key[len("conv2."):]
    if not key.startswith("decoder."):
        raise WeightsError(f"unexpected Wan VAE key {key!r}")
    rest = key[len("decoder."):]
    if rest.startswith("conv1."):
        return "decoder.conv_in." + rest[len("conv1."):]
    if rest.startswith("head.0.") and rest.endswith("gamma"):
        return "decoder.norm_out.gamma"
    if rest.startswith("head.2."):
        return "decoder.conv_out." + rest[len("head.2."):]
    if m := re.match(r"^middle\.(\d)\.(.+)$", rest):
        n, tail = int(m[1]), m[2]
        if n in (0, 2) and tail in _RESIDUAL:
            return f"decoder.mid_block.resnets.{n // 2}.{_RESIDUAL[tail]}"
        if n == 1 and tail in _ATTENTION:
            return f"decoder.mid_block.attentions.0.{tail}"
    if m := re.match(r"^upsamples\.(\d+)\.(.+)$", rest):
        layout = wan_vae_upsample_layout(cfg)
        n, tail = int(m[1]), m[2]
        if n < len(layout):
            block, member = layout[n]
            if member.startswith("resnets.") and tail in _RESIDUAL:
                return f"decoder.up_blocks.{block}.{member}.{_RESIDUAL[tail]}"
            if member == "upsamplers.0" and tail in _RESAMPLE:
                return f"decoder.up_blocks.{block}.upsamplers.0.{tail}"
    raise WeightsError(f"unexpected Wan VAE decoder key {key!r}: no row maps it (is this the Wan 2.1 VAE?)")


# -----------------------------------------------------------------------------
# umT5 encoder: Wan's models_t5_umt5-xxl-enc-bf16.pth -> transformers UMT5EncoderModel

_T5_BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}


def wan_t5_to_transformers(key: str) -> list[str]:
    """One key of Wan's umT5 encoder file -> transformers' name(s) (the token embedding is stored twice).

    Wan's T5Encoder (umT5: a relative position bias in every block, gated-GELU FFN) has the same
    computation as transformers' UMT5EncoderModel; only the names differ.

    Raises:
        WeightsError: a key with no row (a shared position bias, i.e. plain T5, or another model).
    """
    if key == "token_embedding.weight":
        return ["shared.weight", "encoder.embed_tokens.weight"]
    if key == "norm.weight":
        return ["encoder.final_layer_norm.weight"]
    if (m := re.match(r"^blocks\.(\d+)\.(.+)$", key)) and m[2] in _T5_BLOCK:
        return [f"encoder.block.{m[1]}.{_T5_BLOCK[m[2]]}"]
    raise WeightsError(f"unexpected Wan umT5 key {key!r}: no row maps it")


def _invert(table: dict[str, str]) -> dict[str, str]:
    return {v: k for k, v in table.items()}


def diffusers_to_wan_vae(key: str, cfg: WanVAEConfig) -> str:
    """The inverse of `wan_vae_to_diffusers` for the decoder side (to write a file in Wan's own layout).

    Raises:
        WeightsError: a key that is not a Wan 2.1 decoder key in diffusers' names.
    """
    res = _invert(_RESIDUAL)
    if key.startswith("post_quant_conv."):
        return "conv2." + key[len("post_quant_conv."):]
    for ours, theirs in (("decoder.conv_in.", "decoder.conv1."), ("decoder.conv_out.", "decoder.head.2.")):
        if key.startswith(ours):
            return theirs + key[len(ours):]
    if key == "decoder.norm_out.gamma":
        return "decoder.head.0.gamma"
    if (m := re.match(r"^decoder\.mid_block\.resnets\.(\d)\.(.+)$", key)) and m[2] in res:
        return f"decoder.middle.{2 * int(m[1])}.{res[m[2]]}"
    if (m := re.match(r"^decoder\.mid_block\.attentions\.0\.(.+)$", key)) and m[1] in _ATTENTION:
        return f"decoder.middle.1.{m[1]}"
    if m := re.match(r"^decoder\.up_blocks\.(\d+)\.(resnets\.\d+|upsamplers\.0)\.(.+)$", key):
        layout = wan_vae_upsample_layout(cfg)
        n = layout.index((int(m[1]), m[2])) if (int(m[1]), m[2]) in layout else -1
        tail = res.get(m[3]) if m[2].startswith("resnets.") else (m[3] if m[3] in _RESAMPLE else None)
        if n >= 0 and tail:
            return f"decoder.upsamples.{n}.{tail}"
    raise WeightsError(f"no Wan VAE name for {key!r}")


def transformers_to_wan_t5(key: str) -> str | None:
    """The inverse of `wan_t5_to_transformers` (None for the tied copy `encoder.embed_tokens.weight`).

    Raises:
        WeightsError: a key with no row.
    """
    if key == "encoder.embed_tokens.weight":
        return None
    if key == "shared.weight":
        return "token_embedding.weight"
    if key == "encoder.final_layer_norm.weight":
        return "norm.weight"
    if (m := re.match(r"^encoder\.block\.(\d+)\.(.+)$", key)) and m[2] in (inv := _invert(_T5_BLOCK)):
        return f"blocks.{m[1]}.{inv[m[2]]}"
    raise WeightsError(f"no Wan umT5 name for {key!r}")
