"""Attention over a query chunk and a ragged, cached key/value set.

`attention` is the one entry point every model uses. On a CPU (and as the
reference everywhere) it is PyTorch's scaled-dot-product attention with an
additive float bias; the bias carries both per-session validity (ragged
cache lengths, -inf on empty slots) and relative-position terms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Plain softmax attention, the reference for every fast path.

    Args:
        q: (B, H, Nq, hd) queries.
        k: (B, H, Nk, hd) keys.
        v: (B, H, Nk, hd) values.
        bias: additive logits bias broadcastable to (B, H, Nq, Nk); -inf masks.

    Returns:
        (B, H, Nq, hd), dtype of q.
    """
    scale = q.shape[-1] ** -0.5
    logits = (q.float() @ k.float().transpose(-1, -2)) * scale + bias.float()
    return (logits.softmax(dim=-1) @ v.float()).to(q.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Attention with an additive bias; same contract as `attention_reference`.

    Every query row must have at least one finite bias entry (each frame
    always sees itself), or the result row is NaN.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
