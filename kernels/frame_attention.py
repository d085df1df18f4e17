"""Frame-age ALiBi bias over a rolling window with sink frames, for dense attention over explicit keys.

Causal video world models attend from the frames being generated to a
rolling window of recent committed frames plus a few attention-sink frames
(StreamingLLM, Xiao et al. 2023; Self-Forcing / LongLive rollouts), with a
relative-position penalty by frame age (ALiBi, Press et al. 2022, counted
in frames rather than tokens). `FrameAgeBias` describes that bias over an
explicit key sequence (training, offline rollouts) and `dense()` builds the
(B, H, Nq, Nk) tensor for PyTorch SDPA. Serving reads keys in place from
the engine's pool instead: `kernels/ring_attention.py` evaluates the same
rule per key block (fused on CUDA).

Rule (same as `ring_attention` with one frame per chunk): query frame i sees
key frame j iff the slot holds data and j == i, or i - window <= j < i, or
(j < sink_frames and j < i); the logit bias is -slope_h * age, age = i - j,
capped at window + 1 for sinks beyond the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
