"""StatePool: every declared state in fixed slots, positions on a sink + rolling-window ring, batched writes."""

from __future__ import annotations

import pytest
import torch

from worldcast.engine.errors import StatePoolExhausted
from worldcast.engine.state_pool import StatePool
from worldcast.models.base import FrameWrite, MemoryWrite, Replace, RingWrite
from worldcast.models.spec import AttentionRingSpec, FrameRingSpec, TensorStateSpec, WorldMemorySpec

RING = AttentionRingSpec("kv", layers=2, heads=2, head_dim=4, tokens_per_frame=3, window_frames=3, sink_frames=1)
PREV = TensorStateSpec("prev", shape=(2, 5))
LAT = FrameRingSpec("latents", frame_shape=(2,), window_frames=3, sink_frames=1)
STATES = (RING, PREV, LAT)
PER = sum(s.bytes_per_session() for s in STATES)


def ring_write(frames: list[list[int]], value: float) -> RingWrite:
    B, F = len(frames), len(frames[0])
    shape = (B, F * RING.tokens_per_frame, RING.heads, RING.head_dim)
    return RingWrite(torch.tensor(frames), [torch.full(shape, value + layer) for layer in range(RING.layers)],
                     [torch.full(shape, -value - layer) for layer in range(RING.layers)])


def test_a_slot_holds_the_sum_of_every_declared_state_and_exhaustion_is_an_error() -> None:
    # ring: 2 layers x (4 positions x 3 tokens) x 2 heads x 4 x 4 B, K and V, + 4 frame ints
    assert RING.bytes_per_session() == 2 * (2 * 12 * 2 * 4 * 4) + 4 * 8
    pool = StatePool(STATES, budget_bytes=PER * 2 + PER - 1)
    assert pool.num_slots == 2 and pool.slot_bytes == PER
    pool.allocate("a"), pool.allocate("b")
    with pytest.raises(StatePoolExhausted, match="2 state slots"):
        pool.allocate("c")
    pool.free("a")
    pool.free("a")  # idempotent
    assert pool.allocate("c") >= 0 and pool.used_bytes == 2 * PER and pool.free_slots == 0


def test_budget_below_one_session_is_refused_naming_each_state() -> None:
    with pytest.raises(ValueError, match="kv: .* prev: .* latents"):
        StatePool(STATES, budget_bytes=PER - 1)


def test_ring_keeps_the_sink_and_the_last_window_frames() -> None:
    pool = StatePool(STATES, budget_bytes=PER)
    view = pool.view([pool.allocate("a")])
    for i in range(10):
        pool.apply(view, {"kv": ring_write([[i]], float(i))})
    snap = pool.snapshot(0)["kv"]
    assert snap["frame"].tolist() == [0, 7, 8, 9]  # sink 0, then 9 at 1 + (9 - 1) % 3 = 3, 7 at 1, 8 at 2
    assert torch.all(snap["k"][0, 3 * 3:4 * 3] == 9.0) and torch.all(snap["v"][1, 3 * 3:4 * 3] == -10.0)
    assert torch.all(snap["k"][0, 0:3] == 0.0)  # the sink kept its first frame


def test_a_batched_write_lands_in_each_sessions_own_slot_only() -> None:
    pool = StatePool(STATES, budget_bytes=PER * 3)
    a, b, c = pool.allocate("a"), pool.allocate("b"), pool.allocate("c")
    before_c = pool.snapshot(c)
    view = pool.view([b, a])
    pool.apply(view, {"kv": ring_write([[1, 2], [4, 5]], 1.0),  # b gets frames 1, 2; a gets 4, 5
                      "prev": Replace(torch.stack([torch.full((2, 5), 7.0), torch.full((2, 5), 8.0)])),
                      "latents": FrameWrite(torch.tensor([[1, 2], [4, 5]]), torch.ones(2, 2, 2))})
    assert pool.snapshot(b)["kv"]["frame"].tolist() == [-1, 1, 2, -1]
    assert pool.snapshot(a)["kv"]["frame"].tolist() == [-1, 4, 5, -1]  # 4 -> 1 + (4 - 1) % 3 = 1, 5 -> 2
    assert float(pool.snapshot(b)["prev"]["data"][0, 0]) == 7.0 and float(pool.snapshot(a)["prev"]["data"][0, 0]) == 8.0
    for name, ts in pool.snapshot(c).items():
        for t, x in ts.items():
            assert torch.equal(x, before_c[name][t]), f"slot c's {name}.{t} changed"


def test_views_read_in_place_for_one_or_contiguous_slots_and_gather_otherwise() -> None:
    pool = StatePool(STATES, budget_bytes=PER * 3)
    s = [pool.allocate(x) for x in "abc"]
    data = pool.tensors["prev"]["data"]
    one = pool.view([s[1]]).tensor("prev")
    assert one.untyped_storage().data_ptr() == data.untyped_storage().data_ptr()
    one_written = pool.view([s[1]])
    pool.apply(one_written, {"prev": Replace(torch.full((1, 2, 5), 3.0))})
    assert float(one[0, 0, 0]) == 3.0, "a one-slot view sees the pool's own memory"
    gathered = pool.view([s[2], s[0]]).tensor("prev")
    pool.apply(pool.view([s[2]]), {"prev": Replace(torch.full((1, 2, 5), 4.0))})
    assert float(gathered[0, 0, 0]) == 0.0, "a gathered batch is a copy taken at view time"
    k, v, frame = pool.view([s[0]]).ring("kv")
    assert k is pool.tensors["kv"]["k"] and frame is pool.tensors["kv"]["frame"]


def test_a_freed_slot_comes_back_blank() -> None:
    pool = StatePool(STATES, budget_bytes=PER)
    view = pool.view([pool.allocate("a")])
    pool.apply(view, {"kv": ring_write([[0]], 1.0), "prev": Replace(torch.ones(1, 2, 5))})
    pool.free("a")
    snap = pool.snapshot(pool.allocate("b"))
    assert snap["kv"]["frame"].tolist() == [-1] * 4 and not snap["kv"]["k"].any() and not snap["prev"]["data"].any()


def test_an_update_of_the_wrong_kind_or_an_undeclared_state_is_refused() -> None:
    pool = StatePool(STATES, budget_bytes=PER)
    view = pool.view([pool.allocate("a")])
    with pytest.raises(TypeError, match="kv"):
        pool.apply(view, {"kv": Replace(torch.zeros(1))})
    with pytest.raises(KeyError, match="nope"):
        pool.apply(view, {"nope": Replace(torch.zeros(1))})


def test_a_world_memory_is_written_in_place_cells_at_a_time_and_counted_whole() -> None:
    mem = WorldMemorySpec("memory", side=8, channels=3, reach_px=2)
    assert mem.bytes_per_session() == 8 * 8 * 3 + 8 * 8 * 4  # uint8 canvas + int32 tag per cell
    pool = StatePool((PREV, mem), budget_bytes=2 * (PREV.bytes_per_session() + mem.bytes_per_session()))
    a, b = pool.allocate("a"), pool.allocate("b")
    canvas, tag = pool.view([a]).memory("memory")
    assert canvas.data_ptr() == pool.tensors["memory"]["canvas"].data_ptr()  # the pool's own tensors, not a copy
    cells = torch.tensor([[0, 9, 63]])
    pool.apply(pool.view([b]), {"memory": MemoryWrite(cells, torch.full((1, 3, 3), 200, dtype=torch.uint8),
                                                      torch.tensor([[5, 6, 7]], dtype=torch.int32))})
    snap = pool.snapshot(b)["memory"]
    assert snap["tag"].flatten()[[0, 9, 63]].tolist() == [5, 6, 7] and int(snap["tag"].sum()) == 18
    assert (snap["canvas"].view(64, 3)[9] == 200).all() and int(snap["canvas"].sum()) == 9 * 200
    assert int(pool.snapshot(a)["memory"]["tag"].abs().sum()) == 0, "another slot's memory changed"
    with pytest.raises(TypeError, match="cannot apply a Replace"):
        pool.apply(pool.view([a]), {"memory": Replace(torch.zeros(1, 8, 8, 3))})


def test_a_world_memory_narrower_than_its_reach_is_refused() -> None:
    with pytest.raises(ValueError, match="must exceed 2 \\* reach_px"):
        WorldMemorySpec("memory", side=8, reach_px=4)
