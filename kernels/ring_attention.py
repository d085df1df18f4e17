"""Attention from a chunk's queries to a batch of sessions' KV rings, read in place from the pool.

The engine keeps every session's self-attention keys and values in one
pool tensor per layer, `(S, L, H, hd)` (S slots, L = P·T ring tokens:
P frame positions of T tokens each; flash-attn's cache layout). A batch
of sessions attends through their slot indices, the way
`flash_attn_with_kvcache(..., cache_batch_idx=...)` does, with the chunk's
own keys and values as a second source: nothing is gathered, concatenated
or copied per step.

Which keys a query sees (per session; c0 = the chunk's first latent frame,
i = the query's latent frame, j = a key's latent frame):
- every key of its own chunk (block-causal within the chunk);
- a ring key iff its position holds a committed frame (`ring_frame >= 0`) and
  c0 - window <= j < c0 (the rolling window) or j < min(sinks, c0) (an
  attention sink; StreamingLLM, Xiao et al. 2023; LongLive's
  `local_attn_size` / `sink_size`).
Optional frame-age ALiBi (Press et al. 2022, counted in frames): logit bias
-slope_h · age with age = i - j (0 within the own chunk for j >= i), capped
for a sink beyond the window at i - c0 + window + 1 (just past the oldest
window frame).

Three implementations with the same arguments:
- `ring_attention_reference`: gathers and concatenates, builds the dense
  bias, plain softmax (the reference; copies freely).
- the PyTorch path (CPU, or where Triton is absent): per session, matmuls on
  views of the pool and a two-part softmax over ring and own logits.
- `_ring_attention_kernel` (Triton, CUDA; `TRITON_INTERPRET=1` on CPU in
  tests): both sources in one kernel with an online softmax
  (FlashAttention, Dao et al. 2022, Alg. 1), masks and bias evaluated per
  key block from frame indices, no (N, L) tensor in memory.
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
class RingBatch:
    """Per-chunk inputs of ring attention for a batch of sessions (constant over a chunk's steps).

    Build once per chunk and reuse for every denoising step and layer: the
    ring changes only when a chunk commits. Derived tensors (the PyTorch
    path's per-session biases, the kernel's int32 copies) are cached on it.

    Attributes:
        ring_frame: int64 (S, P) absolute latent frame held at each ring position of every slot
            (-1: empty) — the pool's own tensor, read in place.
        slots: int64 (B,) each session's slot, on the device.
        slots_host: the same, on the host (the PyTorch path indexes views with them; no sync).
        q_frame: int64 (B, F) absolute latent frame of each of the chunk's F frames.
        tokens_per_frame: T, tokens per latent frame (queries and keys alike).
        window: committed frames of the rolling window.
        sinks: sink frames.
        slopes: float32 (H,) frame-age ALiBi slopes, logits per frame; None = no bias.
    """

    ring_frame: torch.Tensor
    slots: torch.Tensor
    slots_host: tuple[int, ...]
    q_frame: torch.Tensor
    tokens_per_frame: int
    window: int
    sinks: int
    slopes: torch.Tensor | None = None
    _cache: dict[str, object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.slots.shape != (len(self.slots_host),):
            raise ValueError(f"slots {tuple(self.slots.shape)} vs {len(self.slots_host)} host slots")
        if self.q_frame.shape[0] != len(self.slots_host):
            raise ValueError("q_frame and slots disagree on the batch size")

    @property
    def batch(self) -> int:
        return len(self.slots_host)

    def ring_bias(self, heads: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Per session: additive bias (H or 1, F, 1, L) on its ring logits (-inf = not visible).

        Built once per chunk (cached per head count and dtype).
        """
        key = f"ring_bias/{heads}/{dtype}"
        if key not in self._cache:
            T = self.tokens_per_frame
            out = []
            for b, s in enumerate(self.slots_host):
                kf = self.ring_frame[s]  # (P,) view
                qf = self.q_frame[b]  # (F,)
                c0 = qf[0]
                visible = (kf >= 0) & (((kf >= c0 - self.window) & (kf < c0)) | ((kf < self.sinks) & (kf < c0)))
                bias = torch.zeros((qf.shape[0], kf.shape[0]), dtype=dtype, device=kf.device)
                if self.slopes is not None:
                    age = (qf[:, None] - kf[None, :]).to(dtype)  # (F, P)
                    cap = (qf[:, None] - c0 + self.window + 1).to(dtype).expand_as(age)
                    age = torch.where((kf[None, :] < self.sinks) & (age > cap), cap, age)
                    bias = -self.slopes.to(device=kf.device, dtype=dtype)[:, None, None] * age[None]  # (H, F, P)
                bias = bias.masked_fill(~visible, float("-inf"))
                if bias.dim() == 2:
                    bias = bias[None]  # (1, F, P)
                bias = bias.repeat_interleave(T, dim=-1)[:, :, None, :]  # (H|1, F, 1, P*T)
                out.append(bias.to(dtype))
            self._cache[key] = out
        return self._cache[key]  # type: ignore[return-value]

    def own_bias(self, heads: int, dtype: torch.dtype) -> torch.Tensor | None:
        """(B, H, F, 1, F*T) bias on own-chunk logits (None without ALiBi or with one frame)."""
        if self.slopes is None or self.q_frame.shape[1] == 1:
            return None
        key = f"own_bias/{heads}/{dtype}"
        if key not in self._cache:
            qf = self.q_frame
            age = (qf[:, :, None] - qf[:, None, :]).clamp_min(0).to(dtype)  # (B, F, F)
            bias = -self.slopes.to(device=qf.device, dtype=dtype)[None, :, None, None] * age[:, None]  # (B, H, F, F)
            self._cache[key] = bias.repeat_interleave(self.tokens_per_frame, dim=-1)[:, :, :, None, :].to(dtype)
        return self._cache[key]  # type: ignore[return-value]


def triton_enabled(device: torch.device) -> bool:
    """Whether the Triton kernel can run here: Triton present and a CUDA device, or the
    interpreter requested (`TRITON_INTERPRET=1`)."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor,
           batch: RingBatch) -> None:
    B, N, H, D = q.shape
    if k.shape != (B, N, H, D) or v.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree")
    if k_ring.dim() != 4 or k_ring.shape[2:] != (H, D) or v_ring.shape != k_ring.shape:
        raise ValueError(f"ring {tuple(k_ring.shape)} / {tuple(v_ring.shape)} does not hold (S, L, {H}, {D})")
    if batch.batch != B or N != batch.q_frame.shape[1] * batch.tokens_per_frame:
        raise ValueError(f"queries {tuple(q.shape)} do not match the batch's {batch.batch} sessions of "
                         f"{batch.q_frame.shape[1]} frames x {batch.tokens_per_frame} tokens")
    if k_ring.shape[1] != batch.ring_frame.shape[1] * batch.tokens_per_frame:
        raise ValueError("ring tokens and ring frame positions disagree")


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor,
                   batch: RingBatch) -> torch.Tensor:
    """Attention of a chunk's queries over its own keys and each session's ring, read in place.

    Args:
        q, k, v: (B, N, H, hd) the chunk's queries, keys and values (N = F·T), any float dtype.
        k_ring, v_ring: (S, L, H, hd) one layer's keys and values of every pool slot (may be a
            strided view of a larger pool tensor).
        batch: slots, frame indices and rule (see `RingBatch`).

    Returns:
        (B, N, H, hd) in q's dtype (fp32 accumulation).

    Raises:
        ValueError: shapes disagree.
    """
    _check(q, k, v, k_ring, v_ring, batch)
    if q.is_cuda and triton_enabled(q.device) and q.shape[-1] >= 16 and q.shape[-1] & (q.shape[-1] - 1) == 0:
        return ring_attention_triton(q, k, v, k_ring, v_ring, batch)
    return ring_attention_torch(q, k, v, k_ring, v_ring, batch)


def ring_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_ring: torch.Tensor,
                          v_ring: torch.Tensor, batch: RingBatch) -> torch.Tensor:
    """The PyTorch path: per session, logits against views of its ring and of its own keys.

    Per session: ring logits = bias + scale * q k_ring^T in one `baddbmm` on views of the pool,
    own logits likewise, a softmax over both parts computed in place, and the output as
    P_ring v_ring + P_own v_own. The logit buffers are allocated once per chunk (kept on `batch`)
    and reused by every step and layer.
    """
    B, N, H, D = q.shape
    F = batch.q_frame.shape[1]
    scale = D ** -0.5
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 accumulation (fp64 stays fp64)
    ring_bias = batch.ring_bias(H, acc)
    own_bias = batch.own_bias(H, acc)
    L = k_ring.shape[1]
    bufs = batch._cache.get(key := f"bufs/{H}/{N}/{L}/{acc}")
    if bufs is None:
        bufs = batch._cache[key] = [(torch.empty((H, N, L), dtype=acc, device=q.device),
                                     torch.empty((H, N, N), dtype=acc, device=q.device),
                                     torch.empty((H, N, D), dtype=acc, device=q.device)) for _ in range(B)]
    out = torch.empty_like(q)
    for b, s in enumerate(batch.slots_host):
        lr, lo, y = bufs[b]  # type: ignore[index]
        qh = q[b].transpose(0, 1).to(acc)  # (H, N, D), a view when q is already acc
        kr, vr = k_ring[s], v_ring[s]  # (L, H, D) views of the pool
        rb = ring_bias[b]  # (H|1, F, 1, L)
        if F == 1:
            torch.baddbmm(rb[:, 0], qh, kr.permute(1, 2, 0).to(acc), alpha=scale, out=lr)  # (H, N, L)
        else:
            torch.bmm(qh, kr.permute(1, 2, 0).to(acc), out=lr)
            lr.view(H, F, -1, L).mul_(scale).add_(rb)
        torch.bmm(qh, k[b].permute(1, 2, 0).to(acc), out=lo)  # (H, N, N)
        lo.mul_(scale)
        if own_bias is not None:
            lo.view(H, F, -1, N).add_(own_bias[b])
        m = torch.maximum(lr.amax(-1, keepdim=True), lo.amax(-1, keepdim=True))  # own keys: always finite
        lr.sub_(m).exp_()
        lo.sub_(m).exp_()
        denom = lr.sum(-1, keepdim=True).add_(lo.sum(-1, keepdim=True))
        torch.bmm(lr, vr.transpose(0, 1).to(acc), out=y)
        y.baddbmm_(lo, v[b].transpose(0, 1).to(acc)).div_(denom)
        out[b] = y.transpose(0, 1)
    return out


def ring_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_ring: torch.Tensor,
                             v_ring: torch.Tensor, batch: RingBatch) -> torch.Tensor:
    """The reference: gather each session's ring, concatenate its own keys, dense bias, plain softmax.

    Same contract as `ring_attention` (copies freely; for tests).
    """
    _check(q, k, v, k_ring, v_ring, batch)
    B, N, H, D = q.shape
    T = batch.tokens_per_frame
    idx = batch.slots
    kr, vr = k_ring.index_select(0, idx), v_ring.index_select(0, idx)  # (B, L, H, D)
    kk = torch.cat([kr, k], 1).permute(0, 2, 1, 3).double()  # (B, H, L + N, D)
    vv = torch.cat([vr, v], 1).permute(0, 2, 1, 3).double()
    qq = q.permute(0, 2, 1, 3).double()
    kf_ring = batch.ring_frame.index_select(0, idx).repeat_interleave(T, dim=1)  # (B, L)
    qf = batch.q_frame.repeat_interleave(T, dim=1)  # (B, N)
    kf = torch.cat([kf_ring, qf], 1)  # (B, L + N)
    own = torch.zeros_like(kf, dtype=torch.bool)
    own[:, kf_ring.shape[1]:] = True
    c0 = batch.q_frame[:, :1]  # (B, 1)
    ring_ok = (kf >= 0) & (((kf >= c0 - batch.window) & (kf < c0)) | ((kf < batch.sinks) & (kf < c0)))
    allowed = (own | ring_ok)[:, None, :].expand(-1, N, -1)  # (B, N, L + N)
    logits = (qq @ kk.transpose(-1, -2)) * D ** -0.5  # (B, H, N, L + N)
    if batch.slopes is not None:
        age = (qf[:, :, None] - kf[:, None, :]).double()
        age = torch.where(own[:, None, :], age.clamp_min(0), age)
        cap = (qf[:, :, None] - c0[:, :, None] + batch.window + 1).double().expand_as(age)
        age = torch.where(~own[:, None, :] & (kf[:, None, :] < batch.sinks) & (age > cap), cap, age)
        logits = logits - batch.slopes.double().to(q.device)[None, :, None, None] * age[:, None]
    logits = logits.masked_fill(~allowed[:, None], float("-inf"))
    y = logits.softmax(-1) @ vv  # (B, H, N, D)
    return y.permute(0, 2, 1, 3).to(q.dtype)


if triton is not None:

    @triton.jit
    def _ring_attention_kernel(
        Q, K, V, KR, VR, RF, SL, QF, SLOPES, Out,
        sqb, sqn, sqh, skb, skn, skh, svb, svn, svh,
        srs, srn, srh, svrs, svrn, svrh, srf, sob, son, soh,
        H, N, L, F, T, scale, window, sinks,
        HAS_SLOPES: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        slot = tl.load(SL + b).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        m_ok = offs_m < N
        q = tl.load(Q + b * sqb + offs_m[:, None] * sqn + h * sqh + offs_d[None, :], mask=m_ok[:, None],
                    other=0.0).to(tl.float32)
        qf = tl.load(QF + b * F + offs_m // T, mask=m_ok, other=0)
        c0 = tl.load(QF + b * F)
        slope = 0.0
        if HAS_SLOPES:
            slope = tl.load(SLOPES + h)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # source 1: the session's ring, read in place through its slot
        for start in range(0, L, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_ok = offs_n < L
            kt = tl.load(KR + slot * srs + offs_n[:, None] * srn + h * srh + offs_d[None, :], mask=n_ok[:, None],
                         other=0.0).to(tl.float32)
            vt = tl.load(VR + slot * svrs + offs_n[:, None] * svrn + h * svrh + offs_d[None, :], mask=n_ok[:, None],
                         other=0.0).to(tl.float32)
            kf = tl.load(RF + slot * srf + offs_n // T, mask=n_ok, other=-1)
            ok = (kf >= 0) & (((kf >= c0 - window) & (kf < c0)) | ((kf < sinks) & (kf < c0))) & n_ok
            s = tl.dot(q, tl.trans(kt)) * scale
            if HAS_SLOPES:
                age = qf[:, None] - kf[None, :]
                cap = qf[:, None] - c0 + window + 1
                age = tl.where((kf[None, :] < sinks) & (age > cap), cap, age)
                s = s - slope * age.to(tl.float32)
            s = tl.where(ok[None, :] & m_ok[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, vt)
            m_i = m_new
        # source 2: the chunk's own keys (always visible)
        for start in range(0, N, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_ok = offs_n < N
            kt = tl.load(K + b * skb + offs_n[:, None] * skn + h * skh + offs_d[None, :], mask=n_ok[:, None],
                         other=0.0).to(tl.float32)
            vt = tl.load(V + b * svb + offs_n[:, None] * svn + h * svh + offs_d[None, :], mask=n_ok[:, None],
                         other=0.0).to(tl.float32)
            s = tl.dot(q, tl.trans(kt)) * scale
            if HAS_SLOPES:
                kf = tl.load(QF + b * F + offs_n // T, mask=n_ok, other=0)
                age = tl.maximum(qf[:, None] - kf[None, :], 0)
                s = s - slope * age.to(tl.float32)
            s = tl.where(n_ok[None, :] & m_ok[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, vt)
            m_i = m_new
        out = acc / tl.where(m_ok, l_i, 1.0)[:, None]  # padding rows (not stored) divide by 1
        tl.store(Out + b * sob + offs_m[:, None] * son + h * soh + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=m_ok[:, None])


def ring_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_ring: torch.Tensor,
                          v_ring: torch.Tensor, batch: RingBatch, *, block_m: int = 64,
                          block_n: int = 64) -> torch.Tensor:
    """`ring_attention` as one Triton kernel (same contract); hd a power of two >= 16.

    Raises:
        RuntimeError: Triton cannot run here (see `triton_enabled`).
        ValueError: shapes disagree or hd is not a power of two >= 16.
    """
    if not triton_enabled(q.device):
        raise RuntimeError("ring_attention_triton needs Triton on a CUDA device (or TRITON_INTERPRET=1)")
    _check(q, k, v, k_ring, v_ring, batch)
    B, N, H, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"head dim {D} must be a power of two >= 16")
    for x in (q, k, v, k_ring, v_ring):
        if x.stride(-1) != 1:
            raise ValueError("the head dim must be contiguous")
    c = batch._cache
    if "i32" not in c:  # once per chunk
        c["i32"] = (batch.ring_frame.to(torch.int32), batch.slots.to(torch.int32),
                    batch.q_frame.to(torch.int32).contiguous())
    rf, sl, qf = c["i32"]  # type: ignore[misc]
    slopes = batch.slopes.float().contiguous() if batch.slopes is not None else sl  # unused when absent
    out = torch.empty_like(q)
    grid = (triton.cdiv(N, block_m), B * H)
    _ring_attention_kernel[grid](
        q, k, v, k_ring, v_ring, rf, sl, qf, slopes, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        k_ring.stride(0), k_ring.stride(1), k_ring.stride(2), v_ring.stride(0), v_ring.stride(1), v_ring.stride(2),
        rf.stride(0), out.stride(0), out.stride(1), out.stride(2),
        H, N, k_ring.shape[1], batch.q_frame.shape[1], batch.tokens_per_frame, D ** -0.5, batch.window,
        batch.sinks, HAS_SLOPES=batch.slopes is not None, D=D, BLOCK_M=block_m, BLOCK_N=block_n,
    )
    return out
