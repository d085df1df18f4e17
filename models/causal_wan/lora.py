"""Merging a PEFT LoRA (LongLive's) into the DiT's weights at load time.

LongLive 1.0 (`utils/lora_utils.py`, `inference.py`) wraps every `nn.Linear`
inside the generator's `CausalWanAttentionBlock`s with a PEFT `LoraConfig(r,
lora_alpha)` adapter and loads `lora.pt` with `peft.set_peft_model_state_dict`;
the forward then computes `W x + b + (alpha / r) * B (A x)` (PEFT's
`lora.Linear`, dropout 0). Merged, that is the same linear map with
`W' = W + (alpha / r) * B @ A`, which is what `merge_lora` writes (in float32,
or float64 for float64 weights) so the served model needs no adapter code.

The file holds `{"generator_lora": {...}}` or the bare state dict, with keys
as `get_peft_model_state_dict` writes them:
`base_model.model.blocks.3.self_attn.q.lora_A.weight` (A: (r, in)) and
`...lora_B.weight` (B: (out, r)); an adapter name (`.default`) and FSDP's
`_fsdp_wrapped_module.` are accepted. `r` is read from A's shape; alpha is not
stored in the file and comes from the reference config (LongLive: alpha = r
= 256, scale 1).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from worldcast.models.causal_wan.keys import WeightsError

log = logging.getLogger(__name__)

_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(?P<target>.+)\.lora_(?P<ab>[AB])(?:\.default)?\.weight$")


def lora_pairs(lora: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{target weight name (original DiT names, e.g. "blocks.0.self_attn.q.weight"): (A (r, in), B (out, r))}.

    Raises:
        WeightsError: a key that is not a LoRA A/B weight (e.g. DoRA magnitudes, biases), an A without
            its B, or A/B ranks that differ.
    """
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for raw, t in lora.items():
        key = raw.replace("_fsdp_wrapped_module.", "")
        m = _KEY.match(key)
        if m is None:
            raise WeightsError(f"LoRA key {raw!r} is not a PEFT lora_A/lora_B weight (only plain LoRA is supported)")
        halves.setdefault(m["target"] + ".weight", {})[m["ab"]] = t
    out = {}
    for target, ab in sorted(halves.items()):
        if set(ab) != {"A", "B"}:
            raise WeightsError(f"LoRA for {target} has only lora_{''.join(ab)}")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise WeightsError(f"LoRA for {target}: A {tuple(a.shape)} and B {tuple(b.shape)} do not share a rank")
        out[target] = (a, b)
    if not out:
        raise WeightsError("the LoRA file holds no lora_A / lora_B weights")
    return out


def read_lora(path: str | Path) -> dict[str, torch.Tensor]:
    """The LoRA state dict of a LongLive `lora.pt` (`{"generator_lora": ...}` or bare).

    Raises:
        FileNotFoundError: no such file. WeightsError: not a dict of tensors.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(p)
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    if isinstance(ckpt, dict) and "generator_lora" in ckpt:
        ckpt = ckpt["generator_lora"]
    if not isinstance(ckpt, dict) or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        raise WeightsError(f"{p}: not a LoRA state dict")
    return ckpt


def merge_lora(state: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], *,
               alpha: float | None = None) -> dict[str, torch.Tensor]:
    """`state` with every LoRA target replaced by W + (alpha / r) B @ A; the other tensors are shared.

    Args:
        state: the DiT's state dict, original names (`blocks.0.self_attn.q.weight`, ...).
        lora: a PEFT LoRA state dict (see the module docstring).
        alpha: the LoRA alpha; None = r (LongLive's config: alpha = rank, scale 1).

    Returns:
        a new dict (merged weights keep the base weight's dtype).

    Raises:
        WeightsError: a target the DiT does not have, a shape that does not fit, mixed ranks.
    """
    pairs = lora_pairs(lora)
    ranks = {a.shape[0] for a, _ in pairs.values()}
    if len(ranks) != 1:
        raise WeightsError(f"LoRA ranks differ across layers: {sorted(ranks)}")
    r = ranks.pop()
    scale = (r if alpha is None else alpha) / r
    out = dict(state)
    for target, (a, b) in pairs.items():
        w = state.get(target)
        if w is None:
            raise WeightsError(f"LoRA targets {target}, which the DiT does not have")
        if (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise WeightsError(f"LoRA for {target}: B @ A is {(b.shape[0], a.shape[1])}, the weight {tuple(w.shape)}")
        acc = torch.float64 if w.dtype == torch.float64 else torch.float32
        out[target] = (w.to(acc) + scale * (b.to(acc) @ a.to(acc))).to(w.dtype)
    log.info("causal-wan: merged a rank-%d LoRA into %d weights (scale alpha/r = %g)", r, len(pairs), scale)
    return out
