"""Frame-age ALiBi attention over a rolling window with sink frames, as one fused Triton kernel.

Causal video world models attend from the frames being generated to a
rolling window of recent committed frames plus a few attention-sink frames
(StreamingLLM, Xiao et al. 2023; Self-Forcing / LongLive rollouts), with a
relative-position penalty by frame age (ALiBi, Press et al. 2022, counted
in frames rather than tokens). `FrameAgeBias` describes that bias without
materialising it; `dense()` builds the (B, H, Nq, Nk) tensor for PyTorch
SDPA, and `frame_age_attention` computes attention with the bias evaluated
inside the kernel from per-token frame indices and a per-slot validity mask
(per-session ragged cache lengths), FlashAttention-style: keys in blocks,
an online softmax (Dao et al. 2022, "FlashAttention", Alg. 1), no
(Nq, Nk) tensor in memory.

Rule (same as `dense()`): query frame i sees key frame j iff the slot holds
data and j == i, or i - window <= j < i, or (j < sink_frames and j < i);
the logit bias is -slope_h * age, age = i - j, capped at window + 1 for
sinks beyond the window.

The kernel runs on CUDA devices; on CPU it runs under Triton's interpreter
(`TRITON_INTERPRET=1`, how the tests check it against the reference).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

try:  # Triton is optional: the CPU path never needs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]


@dataclass
class FrameAgeBias:
    """A frame-age ALiBi bias with rolling window and sinks, not yet materialised.

    Attributes:
        q_frame: int64 (B, Nq) absolute frame index of each query token.
        k_frame: int64 (B, Nk) absolute frame index of each key token.
        k_valid: bool (B, Nk) whether that key slot holds data.
        slopes: float32 (H,) per-head penalty, logits per frame of age.
        window: frames in the rolling window.
        sink_frames: frames kept as attention sinks.
    """

    q_frame: torch.Tensor
    k_frame: torch.Tensor
    k_valid: torch.Tensor
    slopes: torch.Tensor
    window: int
    sink_frames: int
    _dense: torch.Tensor | None = field(default=None, repr=False)

    def dense(self) -> torch.Tensor:
        """float32 (B, H, Nq, Nk): 0 or negative where allowed, -inf elsewhere (computed once)."""
        if self._dense is None:
            age = self.q_frame[:, :, None] - self.k_frame[:, None, :]  # (B, Nq, Nk)
            sink = self.k_frame[:, None, :] < self.sink_frames
            in_window = (age > 0) & (age <= self.window)
            allowed = ((age == 0) | in_window | (sink & (age > 0))) & self.k_valid[:, None, :]
            age = torch.where(sink & (age > self.window), torch.full_like(age, self.window + 1), age)
            bias = -self.slopes.to(age.device)[None, :, None, None] * age[:, None].float()
            self._dense = bias.masked_fill(~allowed[:, None], float("-inf"))
        return self._dense


def triton_enabled(device: torch.device) -> bool:
    """Whether `frame_age_attention` can run here: Triton present and a CUDA device, or the
    interpreter requested (`TRITON_INTERPRET=1`)."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _frame_age_attention_kernel(
        Q, K, V, Out, QF, KF, KV, S,
        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
        H, NQ, NK, scale, window, sinks,
        D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        m_ok = offs_m < NQ
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :], mask=m_ok[:, None], other=0.0)
        qf = tl.load(QF + b * NQ + offs_m, mask=m_ok, other=0)
        slope = tl.load(S + h)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for start in range(0, NK, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_ok = offs_n < NK
            k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            kf = tl.load(KF + b * NK + offs_n, mask=n_ok, other=0)
            kvalid = tl.load(KV + b * NK + offs_n, mask=n_ok, other=0) != 0
            age = qf[:, None] - kf[None, :]
            sink = kf[None, :] < sinks
            allowed = (age == 0) | ((age > 0) & (age <= window)) | (sink & (age > 0))
            allowed = allowed & kvalid[None, :] & n_ok[None, :] & m_ok[:, None]
            age = tl.where(sink & (age > window), window + 1, age)
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32))) * scale - slope * age.to(tl.float32)
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
            m_i = m_new
        out = acc / tl.where(m_ok, l_i, 1.0)[:, None]  # padding rows (not stored) divide by 1
        tl.store(Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=m_ok[:, None])


def frame_age_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: FrameAgeBias, *,
                        block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """Softmax attention with `bias` evaluated in the kernel.

    Args:
        q: (B, H, Nq, hd) queries; hd a power of two >= 16.
        k: (B, H, Nk, hd) keys.
        v: (B, H, Nk, hd) values.
        bias: which keys each query sees and their age penalty.

    Returns:
        (B, H, Nq, hd), dtype of q. Rows that see no key are NaN (as with SDPA).

    Raises:
        RuntimeError: Triton is not available here (see `triton_enabled`).
        ValueError: shapes disagree or hd is not a power of two >= 16.
    """
    if not triton_enabled(q.device):
        raise RuntimeError("frame_age_attention needs Triton on a CUDA device (or TRITON_INTERPRET=1)")
    B, H, NQ, D = q.shape
    NK = k.shape[2]
    if k.shape != (B, H, NK, D) or v.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree")
    if D < 16 or D & (D - 1):
        raise ValueError(f"head dim {D} must be a power of two >= 16")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty_like(q)
    qf = bias.q_frame.to(torch.int32).contiguous()
    kf = bias.k_frame.to(torch.int32).contiguous()
    kvalid = bias.k_valid.to(torch.int8).contiguous()
    slopes = bias.slopes.to(device=q.device, dtype=torch.float32).contiguous()
    grid = (triton.cdiv(NQ, block_m), B * H)
    _frame_age_attention_kernel[grid](
        q, k, v, out, qf, kf, kvalid, slopes,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        H, NQ, NK, D ** -0.5, bias.window, bias.sink_frames,
        D=D, BLOCK_M=block_m, BLOCK_N=block_n,
    )
    return out
