"""Attention over a query chunk and a ragged, cached key/value set.

`attention` is the one entry point every model uses. The bias carries both
per-session validity (ragged cache lengths, -inf on empty slots) and
relative-position terms; it is either a dense float tensor or a
`FrameAgeBias` (frame-age ALiBi over a rolling window with sinks, see
`kernels/frame_attention.py`). On a CUDA device with Triton a
`FrameAgeBias` runs the fused kernel, which evaluates the bias per key
block and never materialises it; everywhere else (and as the reference)
it is PyTorch's scaled-dot-product attention with the dense bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldcast.kernels.frame_attention import FrameAgeBias, frame_age_attention, triton_enabled


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
        if q.is_cuda and triton_enabled(q.device):
            return frame_age_attention(q, k, v, bias)
        bias = bias.dense()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
