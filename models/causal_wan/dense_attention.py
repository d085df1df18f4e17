"""The causal attention rule (rolling window + attention sinks) and a dense reference cache.

The rule, as LongLive 1.0 applies it (NVlabs/LongLive
`wan/modules/causal_model.py`, `CausalWanSelfAttention.forward`, KV-cache
branch; Self-Forcing's is the same with no sinks): a chunk whose latent frames
end at e (exclusive) attends, with every one of its queries, to the keys of
latent frames j with

    j < e  and  (local_attn_size == -1  or  j < sink_size  or  j >= e - (local_attn_size - sink_size))

i.e. the session's first `sink_size` frames plus the most recent
`local_attn_size - sink_size` frames, the chunk's own frames among them
(frames of a chunk see each other both ways: block-causal). LongLive keeps a
cache of `local_attn_size` frames, writes the chunk into it, and attends to
its first `sink_size` frames plus its last `local_attn_size - sink_size`.

`DenseSelfAttention` implements the DiT's `attend` over an explicit dense
per-layer cache with a latent-frame index per token; the parity tests use it,
and it is the behaviour the engine's pool-backed implementation must match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldcast.models.causal_wan.config import CausalWanConfig
from worldcast.models.causal_wan.dit import KV


def visible_key_frames(
    key_frame: torch.Tensor, chunk_end: torch.Tensor, *, local_attn_size: int, sink_size: int
) -> torch.Tensor:
    """Which keys a chunk sees, by the rule in this module's docstring.

    Args:
        key_frame: int64 (B, L) absolute latent-frame index of each key.
        chunk_end: int64 (B,) one past the chunk's last latent frame.
        local_attn_size: frames attended, sinks and the chunk included; -1 = all.
        sink_size: the session's first frames, always attended.

    Returns:
        bool (B, L).
    """
    end = chunk_end[:, None]
    vis = key_frame < end
    if local_attn_size != -1:
        vis &= (key_frame < sink_size) | (key_frame >= end - (local_attn_size - sink_size))
    return vis


class DenseSelfAttention:
    """Reference self-attention state of a batch of sessions: dense K, V per layer with frame indices.

    Use: `begin_chunk(frame_offset, F)`, run the DiT (which calls `attend`),
    and after the commit pass `commit(kv)`, which appends the
    chunk's keys and evicts frames no later chunk can see. Memory stays
    bounded by `cfg.kv_cache_frames` frames per session when windowed.

    Attributes:
        k, v: per layer (B, L, H, hd) committed keys (after RoPE) and values, or None when empty.
        frame: int64 (B, L) latent-frame index of each cached token.
        valid: bool (B, L) whether the slot holds a committed token (rows of a stacked batch are padded).
    """

    def __init__(self, cfg: CausalWanConfig, batch: int, *, device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        self.k: list[torch.Tensor | None] = [None] * cfg.layers
        self.v: list[torch.Tensor | None] = [None] * cfg.layers
        self.frame = torch.zeros(batch, 0, dtype=torch.int64, device=device)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)
        self._chunk_start: torch.Tensor | None = None
        self._chunk_end: torch.Tensor | None = None
        self._num_frames = 0

    @property
    def batch(self) -> int:
        return self.frame.shape[0]

    def cached_frames(self) -> list[int]:
        """Distinct committed latent frames held per session (for memory checks)."""
        return [int(torch.unique(f[m]).numel()) for f, m in zip(self.frame, self.valid)]

    def begin_chunk(self, frame_offset: torch.Tensor, num_frames: int) -> None:
        """Set the chunk the next `attend` calls are for: int64 (B,) first frame, F frames."""
        assert frame_offset.shape == (self.batch,), f"frame_offset must be ({self.batch},)"
        self._chunk_start = frame_offset.to(torch.int64)
        self._num_frames = num_frames
        self._chunk_end = self._chunk_start + num_frames

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q K^T / sqrt(hd)) V over the visible cached keys of `layer` and the chunk's own.

        Args:
            q, k, v: (B, N, H, hd), q and k after RoPE.

        Returns:
            (B, N, H, hd), dtype of q.
        """
        assert self._chunk_end is not None, "call begin_chunk first"
        B, N = q.shape[:2]
        past_k, past_v = self.k[layer], self.v[layer]
        if past_k is None or past_k.shape[1] == 0:
            keys, values = k, v
            mask = None
        else:
            assert past_v is not None
            keys = torch.cat([past_k.to(k.dtype), k], dim=1)  # (B, L + N, H, hd)
            values = torch.cat([past_v.to(v.dtype), v], dim=1)
            vis = self.valid & visible_key_frames(
                self.frame, self._chunk_end, local_attn_size=self.cfg.local_attn_size, sink_size=self.cfg.sink_size
            )
            mask = torch.cat([vis, vis.new_ones(B, N)], dim=1)[:, None, None, :]  # (B, 1, 1, L + N)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask
        )  # (B, H, N, hd)
        return y.transpose(1, 2)

    def commit(self, kv: list[KV], *, evict: bool = True) -> None:
        """Append the current chunk's keys and values, then (optionally) evict what no later chunk sees.

        Args:
            kv: per layer (K, V) each (B, N, H, hd) from the commit pass of the chunk set by `begin_chunk`.
            evict: drop frames outside the window of the next chunk (ending frames_per_chunk frames later).
        """
        assert self._chunk_start is not None and self._chunk_end is not None, "call begin_chunk first"
        B, N = kv[0][0].shape[:2]
        Fn = self._num_frames
        assert N % Fn == 0, f"{N} tokens do not split into {Fn} frames"
        offs = torch.arange(Fn, device=self.frame.device)
        new_frame = (self._chunk_start[:, None] + offs).repeat_interleave(N // Fn, dim=1)  # (B, N), frame-major
        for i, (k, v) in enumerate(kv):
            pk, pv = self.k[i], self.v[i]
            self.k[i] = k if pk is None else torch.cat([pk, k.to(pk.dtype)], dim=1)
            self.v[i] = v if pv is None else torch.cat([pv, v.to(pv.dtype)], dim=1)
        self.frame = torch.cat([self.frame, new_frame], dim=1)
        self.valid = torch.cat([self.valid, self.valid.new_ones(B, N)], dim=1)
        if evict and self.cfg.local_attn_size != -1:
            next_end = self._chunk_end + self.cfg.frames_per_chunk
            self.valid &= visible_key_frames(
                self.frame, next_end, local_attn_size=self.cfg.local_attn_size, sink_size=self.cfg.sink_size
            )
            self._compact()

    def _compact(self) -> None:
        """Drop token columns that are invalid in every row."""
        keep = self.valid.any(dim=0)
        if bool(keep.all()):
            return
        self.frame, self.valid = self.frame[:, keep], self.valid[:, keep]
        for i in range(len(self.k)):
            k, v = self.k[i], self.v[i]
            if k is not None and v is not None:
                self.k[i], self.v[i] = k[:, keep], v[:, keep]

    @classmethod
    def stack(cls, sessions: list[DenseSelfAttention]) -> DenseSelfAttention:
        """One batch from several sessions' states (each of batch 1), padded with invalid slots."""
        cfg = sessions[0].cfg
        out = cls(cfg, len(sessions), device=sessions[0].frame.device)
        L = max(s.frame.shape[1] for s in sessions)
        if L == 0:
            return out

        def pad(t: torch.Tensor, value: float | bool | int) -> torch.Tensor:
            extra = L - t.shape[1]
            if t.dim() == 2:
                return F.pad(t, (0, extra), value=value)
            return F.pad(t, (0, 0, 0, 0, 0, extra), value=value)

        out.frame = torch.cat([pad(s.frame, 0) for s in sessions])
        out.valid = torch.cat([pad(s.valid, False) for s in sessions])
        ref = next(s for s in sessions if s.k[0] is not None)
        for i in range(cfg.layers):
            rk, rv = ref.k[i], ref.v[i]
            assert rk is not None and rv is not None
            ks = [pad(s.k[i] if s.k[i] is not None else rk[:1, :0], 0.0) for s in sessions]  # type: ignore[arg-type]
            vs = [pad(s.v[i] if s.v[i] is not None else rv[:1, :0], 0.0) for s in sessions]  # type: ignore[arg-type]
            out.k[i], out.v[i] = torch.cat(ks), torch.cat(vs)
        return out
