"""Ring attention (kernels/ring_attention.py): the PyTorch path and the Triton kernel against the reference.

The Triton kernel runs under Triton's interpreter on the CPU (`TRITON_INTERPRET=1`, which Triton reads
when a kernel is defined, so that check runs in a fresh interpreter process).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from worldcast.kernels.ring_attention import RingBatch, ring_attention, ring_attention_reference

# A small pool: S slots, P ring positions (sink 1 + window 3) of T tokens.
S, P, T, H, D, WINDOW, SINKS = 4, 4, 3, 2, 16, 3, 1


def make_case(chunk_starts: list[int], F: int, slots: list[int], *, slopes: bool, seed: int = 0,
              dtype: torch.dtype = torch.float64):  # type: ignore[no-untyped-def]
    """Rings filled as a session that has committed frames 0..c0-1 would have them."""
    g = torch.Generator().manual_seed(seed)
    k_ring = torch.randn(S, P * T, H, D, generator=g, dtype=dtype)
    v_ring = torch.randn(S, P * T, H, D, generator=g, dtype=dtype)
    ring_frame = torch.full((S, P), -1, dtype=torch.int64)
    for s, c0 in zip(slots, chunk_starts, strict=True):
        for j in range(c0):  # commit frames 0..c0-1 in order: later ones overwrite window positions
            pos = j if j < SINKS else SINKS + (j - SINKS) % WINDOW
            ring_frame[s, pos] = j
    B, N = len(slots), F * T
    q, k, v = (torch.randn(B, N, H, D, generator=g, dtype=dtype) for _ in range(3))
    q_frame = torch.tensor([[c0 + f for f in range(F)] for c0 in chunk_starts])
    batch = RingBatch(ring_frame, torch.tensor(slots), tuple(slots), q_frame, T, WINDOW, SINKS,
                      torch.tensor([0.5, 0.0]) if slopes else None)
    return q, k, v, k_ring, v_ring, batch


@pytest.mark.parametrize("slopes", [False, True])
@pytest.mark.parametrize("F", [1, 3])
def test_torch_path_equals_the_reference_over_ragged_rings(F: int, slopes: bool) -> None:
    # fresh (empty ring), partly filled, wrapped around past the window with a sink beyond it
    q, k, v, kr, vr, batch = make_case([0, 2, 9], F, [3, 0, 2], slopes=slopes)
    out = ring_attention(q, k, v, kr, vr, batch)
    ref = ring_attention_reference(q, k, v, kr, vr, batch)
    err = (out - ref).abs().max().item()
    assert err <= 1e-12, f"fp64 max abs error {err:.3g} > 1e-12"


def test_the_rule_is_what_the_reference_says_and_can_fail() -> None:
    """A ring key older than the window changes nothing; one inside it does (so the test can fail)."""
    q, k, v, kr, vr, batch = make_case([9], 1, [1], slopes=False)
    base = ring_attention(q, k, v, kr, vr, batch)
    frames = batch.ring_frame[1].tolist()  # sink 0 and window 6, 7, 8
    assert sorted(frames) == [0, 6, 7, 8]
    stale = batch.ring_frame.clone()
    stale[1, frames.index(6)] = 5  # now holds a frame beyond the window: must be ignored
    b2 = RingBatch(stale, batch.slots, batch.slots_host, batch.q_frame, T, WINDOW, SINKS)
    assert not torch.allclose(ring_attention(q, k, v, kr, vr, b2), base)
    kr2 = kr.clone()
    kr2[1, frames.index(6) * T:(frames.index(6) + 1) * T] += 100.0
    assert torch.allclose(ring_attention(q, k, v, kr2, vr, b2), ring_attention(q, k, v, kr, vr, b2))
    # other slots' contents never matter
    kr3 = kr.clone()
    kr3[0] += 100.0
    assert torch.equal(ring_attention(q, k, v, kr3, vr, batch), base)


def test_a_batch_equals_each_session_alone() -> None:
    q, k, v, kr, vr, batch = make_case([1, 5, 12], 3, [2, 0, 3], slopes=True)
    out = ring_attention(q, k, v, kr, vr, batch)
    for b, s in enumerate(batch.slots_host):
        one = RingBatch(batch.ring_frame, batch.slots[b:b + 1], (s,), batch.q_frame[b:b + 1], T, WINDOW, SINKS,
                        batch.slopes)
        torch.testing.assert_close(ring_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], kr, vr, one), out[b:b + 1],
                                   atol=1e-12, rtol=0)


def test_bad_shapes_are_refused_with_the_shapes_named() -> None:
    q, k, v, kr, vr, batch = make_case([2], 1, [0], slopes=False)
    with pytest.raises(ValueError, match="disagree"):
        ring_attention(q, k[:, :2], v, kr, vr, batch)
    with pytest.raises(ValueError, match="ring"):
        ring_attention(q, k, v, kr[:, :, :1], vr, batch)


CHECK = r'''
import torch
from tests.kernels.test_ring_attention import make_case
from worldcast.kernels.ring_attention import ring_attention_reference, ring_attention_triton, triton_enabled
assert triton_enabled(torch.device("cpu"))
worst = 0.0
for F in (1, 3):
    for slopes in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v, kr, vr, batch = make_case([0, 2, 9], F, [3, 0, 2], slopes=slopes, dtype=dtype)
            for bm, bn in [(16, 16), (8, 32)]:
                out = ring_attention_triton(q, k, v, kr, vr, batch, block_m=bm, block_n=bn).float()
                ref = ring_attention_reference(q, k, v, kr, vr, batch).float()
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                err = (out - ref).abs().max().item()
                assert err < tol, (F, slopes, dtype, bm, bn, err)
                worst = max(worst, err if dtype == torch.float32 else 0.0)
print("MAXERR", worst)
'''


def test_triton_kernel_matches_the_reference_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode == 0, r.stderr[-3000:]
    err = float(r.stdout.split("MAXERR")[1])
    assert err < 1e-4, err
