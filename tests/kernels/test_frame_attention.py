"""The fused frame-age attention kernel against the dense reference.

The Triton kernel runs under Triton's interpreter on the CPU (`TRITON_INTERPRET=1`, which Triton
reads when a kernel is defined, so the check runs in a fresh interpreter process).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from worldcast.kernels.attention import attention, attention_reference
from worldcast.kernels.frame_attention import FrameAgeBias, triton_enabled

CHECK = r'''
import torch
from worldcast.kernels.attention import attention_reference
from worldcast.kernels.frame_attention import FrameAgeBias, frame_age_attention, triton_enabled
assert triton_enabled(torch.device("cpu"))
torch.manual_seed(0)
T, H, D, window, sinks = 8, 3, 16, 4, 1
worst = 0.0
# (current frame, slots per session, committed frames per session): ragged caches, sinks beyond the window
for cur, slots, committed in [(3, 5, [3, 1]), (9, 5, [5, 5]), (1, 5, [1, 0])]:
    B = len(committed)
    k_frame = torch.zeros(B, slots * T, dtype=torch.int64)
    k_valid = torch.zeros(B, slots * T, dtype=torch.bool)
    for b, n in enumerate(committed):
        frames = [0] + list(range(max(1, cur - window), cur)) if n else []
        frames = frames[:n] if cur <= window else frames
        for s, f in enumerate(frames[:slots]):
            k_frame[b, s * T:(s + 1) * T] = f
            k_valid[b, s * T:(s + 1) * T] = True
    q_frame = torch.full((B, T), cur, dtype=torch.int64)
    k_frame = torch.cat([k_frame, q_frame], 1)
    k_valid = torch.cat([k_valid, torch.ones(B, T, dtype=torch.bool)], 1)
    q = torch.randn(B, H, T, D)
    k = torch.randn(B, H, k_frame.shape[1], D)
    v = torch.randn(B, H, k_frame.shape[1], D)
    bias = FrameAgeBias(q_frame, k_frame, k_valid, torch.tensor([0.5, 0.25, 0.0]), window, sinks)
    for bm, bn in [(16, 16), (8, 32)]:
        out = frame_age_attention(q, k, v, bias, block_m=bm, block_n=bn)
        ref = attention_reference(q, k, v, bias.dense())
        worst = max(worst, (out - ref).abs().max().item())
print("MAXERR", worst)
'''


def test_triton_kernel_matches_the_dense_reference_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    err = float(r.stdout.split("MAXERR")[1])
    assert err < 1e-4, err


def test_dense_bias_is_built_once_and_the_cpu_path_uses_it() -> None:
    q_frame = torch.full((1, 2), 5)
    k_frame = torch.tensor([[0, 0, 3, 3, 4, 4, 5, 5]])
    k_valid = torch.tensor([[True] * 6 + [True] * 2])
    bias = FrameAgeBias(q_frame, k_frame, k_valid, torch.tensor([0.5, 0.0]), window=2, sink_frames=1)
    dense = bias.dense()
    assert dense is bias.dense()  # cached: every layer of a forward reuses it
    assert dense.shape == (1, 2, 2, 8)
    # sink frame 0 is beyond the window: allowed, age capped at window + 1 = 3 -> -0.5 * 3
    assert dense[0, 0, 0, 0].item() == pytest.approx(-1.5)
    assert dense[0, 0, 0, 2].item() == pytest.approx(-1.0)  # frame 3, age 2, inside the window
    assert dense[0, 1, 0, 2].item() == 0.0  # zero-slope head
    only_own = torch.zeros_like(k_valid).index_fill_(1, torch.tensor([6, 7]), True)
    masked = FrameAgeBias(q_frame, k_frame, only_own, torch.tensor([0.5, 0.0]), 2, 1).dense()
    assert torch.isinf(masked[0, 0, 0, :6]).all()  # empty slots are masked
    q, k, v = torch.randn(1, 2, 2, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    assert torch.allclose(attention(q, k, v, bias), attention_reference(q, k, v, dense), atol=1e-5)


def test_kernel_is_only_used_where_triton_can_run() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert not triton_enabled(torch.device("cpu"))
