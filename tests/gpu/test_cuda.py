"""On a CUDA device: the Triton ring-attention kernel against the reference in bf16 and fp32, batched against
solo rollouts, and the causal-Wan engine path (run by `python -m worldcast.latency_bench.gpu_check`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("F,slopes", [(1, True), (3, False)])
def test_triton_ring_attention_matches_the_reference(dtype: torch.dtype, tol: float, F: int, slopes: bool) -> None:
    from worldcast.kernels.ring_attention import RingBatch, ring_attention, ring_attention_reference

    g = torch.Generator(device="cuda").manual_seed(0)
    S, sinks, window, T, H, D = 6, 3, 6, 64, 12, 128
    P = sinks + window
    k_ring = torch.randn(S, P * T, H, D, generator=g, device="cuda", dtype=dtype)
    v_ring = torch.randn(S, P * T, H, D, generator=g, device="cuda", dtype=dtype)
    ring_frame = torch.full((S, P), -1, dtype=torch.int64, device="cuda")
    starts, slots = [0, 4 * F, 11 * F], [5, 0, 2]
    for s, c0 in zip(slots, starts, strict=True):
        for j in range(c0):
            ring_frame[s, j if j < sinks else sinks + (j - sinks) % window] = j
    q, k, v = (torch.randn(3, F * T, H, D, generator=g, device="cuda", dtype=dtype) for _ in range(3))
    batch = RingBatch(ring_frame, torch.tensor(slots, device="cuda"), tuple(slots),
                      torch.tensor([[c + f for f in range(F)] for c in starts], device="cuda"), T, window, sinks,
                      torch.linspace(0.5, 0.0, H, device="cuda") if slopes else None)
    out = ring_attention(q, k, v, k_ring, v_ring, batch).float()
    ref = ring_attention_reference(q, k, v, k_ring, v_ring, batch).float()
    assert (out - ref).abs().max().item() < tol


def test_batched_and_solo_rollouts_agree_on_cuda() -> None:
    from worldcast.engine.rollout import BatchCache, ChunkRollout, denoise_batch, finalize_batch
    from worldcast.engine.scripted import ScriptedConditioner
    from worldcast.engine.state_pool import StatePool
    from worldcast.models.tinyworld import TinyWorldModel, world

    m = TinyWorldModel.from_pretrained(device="cuda")
    pool = StatePool(m.spec.states, budget_bytes=m.spec.state_bytes_per_session() * 3, device="cuda")
    d = world.action_vector({"d": True})
    a, b, solo = (ChunkRollout(n, m, pool, ScriptedConditioner(m.spec, action=d if n != "b" else None), seed=s)
                  for n, s in (("a", 3), ("b", 4), ("solo", 3)))
    for r in (a, b, solo):
        r.init(0.0)
    cache = BatchCache()
    for _ in range(5):
        for r in (a, b):
            r.begin_chunk(0.0, 0.0)
        for k in range(m.spec.denoising_steps):
            denoise_batch([a, b], [k, k], cache)
        fa = finalize_batch([a, b], 0.0, cache=cache)[0]
        solo.begin_chunk(0.0, 0.0)
        for k in range(m.spec.denoising_steps):
            denoise_batch([solo], [k], cache)
        fs = finalize_batch([solo], 0.0, cache=cache)[0]
        assert np.abs(fa.image.astype(int) - fs.image.astype(int)).max() <= 2
