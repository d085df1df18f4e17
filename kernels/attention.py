"""Attention over explicit keys and values with an additive bias (training and offline rollouts).

The bias carries validity (-inf masks) and relative-position terms; it is a
dense float tensor or a `FrameAgeBias` (frame-age ALiBi over a rolling
window with sinks, `kernels/frame_attention.py`), materialised once per
forward. Serving reads cached keys in place from the engine's pool through
`kernels/ring_attention.py` instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldcast.kernels.frame_attention import FrameAgeBias


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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | FrameAgeBias) -> torch.Tensor:
    """Attention with an additive bias; same contract as `attention_reference`.

    Every query row must have at least one finite bias entry (each frame
    always sees itself), or the result row is NaN.
    """
    if isinstance(bias, FrameAgeBias):
        bias = bias.dense()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
