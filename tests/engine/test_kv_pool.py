import pytest
import torch

from worldcast.engine.errors import KVPoolExhausted
from worldcast.engine.kv_pool import KVPool
from worldcast.models.spec import KVGeometry

GEO = KVGeometry(layers=2, heads=2, head_dim=4, tokens_per_frame=3, window_frames=3, sink_frames=1)


def _kv(value: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, 3, 4), value), torch.full((2, 3, 4), -value)) for _ in range(GEO.layers)]


def test_slots_fit_the_budget_and_exhaustion_is_an_error() -> None:
    pool = KVPool(GEO, budget_bytes=GEO.bytes_per_session() * 2 + 5)
    assert pool.num_slots == 2 and pool.budget_bytes == 2 * GEO.bytes_per_session()
    pool.allocate("a"), pool.allocate("b")
    with pytest.raises(KVPoolExhausted):
        pool.allocate("c")
    pool.free("a")
    pool.free("a")  # idempotent
    assert pool.allocate("c") >= 0 and pool.used_bytes == 2 * GEO.bytes_per_session()


def test_budget_below_one_session_is_rejected() -> None:
    with pytest.raises(ValueError, match="below one session"):
        KVPool(GEO, budget_bytes=10)


def test_ring_keeps_sink_and_last_window_frames_in_place() -> None:
    pool = KVPool(GEO, budget_bytes=GEO.bytes_per_session())
    s = pool.allocate("a")
    ptr = pool.k.data_ptr()
    for i in range(10):
        pool.append(s, [i], _kv(float(i)))
    _, _, fi = pool.snapshot(s)
    assert sorted(fi.tolist()) == [0, 7, 8, 9]  # sink 0 + window of 3
    assert pool.k.data_ptr() == ptr  # no reallocation, no copy on eviction
    view = pool.view([s])
    assert view.k_frame.shape == (1, GEO.capacity_tokens) and bool(view.k_valid.all())
    pos = pool.position(9)
    assert float(pool.k[0, s, 0, pos * 3, 0]) == 9.0 and float(pool.v[1, s, 1, pos * 3 + 2, 3]) == -9.0


def test_batched_view_gathers_each_sessions_frames_and_masks_empty_slots() -> None:
    pool = KVPool(GEO, budget_bytes=GEO.bytes_per_session() * 3)
    a, b = pool.allocate("a"), pool.allocate("b")
    pool.append(a, [0], _kv(1.0))
    pool.append(b, [0], _kv(2.0))
    pool.append(b, [1], _kv(3.0))
    v = pool.view([b, a])
    assert v.kv[0][0].shape == (2, GEO.heads, GEO.capacity_tokens, GEO.head_dim)
    assert v.k_valid[0].sum().item() == 6 and v.k_valid[1].sum().item() == 3
    assert float(v.kv[0][0][1, 0, 0, 0]) == 1.0


def test_freed_slot_comes_back_empty() -> None:
    pool = KVPool(GEO, budget_bytes=GEO.bytes_per_session())
    s = pool.allocate("a")
    pool.append(s, [0], _kv(1.0))
    pool.free("a")
    s2 = pool.allocate("b")
    assert not pool.view([s2]).k_valid.any()
