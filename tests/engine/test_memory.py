"""The state pool sized from the machine (fake memory readings): bytes by kind, the fraction, the cap,
the refusal of a device that cannot hold one session, the host reading, and the activation hook."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
import torch

from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.errors import DeviceTooSmall
from worldcast.engine.memory import GiB, MemoryReading, freeze_startup_objects, plan_state_memory, read_device_memory
from worldcast.models.spec import AttentionRingSpec, PromptCacheSpec, TensorStateSpec

STATES = (
    AttentionRingSpec("kv", layers=2, heads=2, head_dim=8, tokens_per_frame=16, window_frames=6, sink_frames=3),
    PromptCacheSpec("cross", shape=(2, 2, 16, 2, 8)),
    TensorStateSpec("vae.00", shape=(4, 2, 8, 8)),
    TensorStateSpec("vae.01", shape=(8, 2, 16, 16)),
)
SLOT = sum(s.bytes_per_session() for s in STATES)


def fake(free: int, total: int = 10 * GiB) -> MemoryReading:
    return MemoryReading(free, total, "fake reading")


def test_the_budget_is_a_fraction_of_the_free_memory_and_bytes_are_told_by_kind() -> None:
    plan = plan_state_memory(STATES, state_budget_bytes=None, memory_fraction=0.5, max_slots=1000,
                             reading=fake(SLOT * 10))
    assert plan.num_slots == plan.fit_slots == 5 and plan.budget_bytes == 5 * SLOT
    assert plan.by_kind == {"AttentionRingSpec": STATES[0].bytes_per_session(),
                            "PromptCacheSpec": STATES[1].bytes_per_session(),
                            "TensorStateSpec": STATES[2].bytes_per_session() + STATES[3].bytes_per_session()}
    assert plan.names_by_kind["TensorStateSpec"] == ("vae.00", "vae.01")
    assert plan.headroom_bytes == 5 * SLOT  # what is left of the reading for activations
    line = plan.describe()
    assert "holds 5 session(s)" in line and "0.50 x" in line and "fake reading" in line and "AttentionRingSpec" in line


def test_a_byte_budget_wins_and_the_slot_cap_holds() -> None:
    plan = plan_state_memory(STATES, state_budget_bytes=SLOT * 7 + 1, memory_fraction=0.1, max_slots=1000,
                             reading=None)
    assert plan.num_slots == 7 and plan.headroom_bytes is None and "given" in plan.how
    capped = plan_state_memory(STATES, state_budget_bytes=None, memory_fraction=1.0, max_slots=3,
                               reading=fake(SLOT * 100))
    assert (capped.num_slots, capped.fit_slots, capped.budget_bytes) == (3, 100, 3 * SLOT)
    assert "capped from 100" in capped.describe()


def test_a_device_that_cannot_hold_one_session_is_refused_with_the_numbers() -> None:
    with pytest.raises(DeviceTooSmall, match="cannot hold one session") as e:
        plan_state_memory(STATES, state_budget_bytes=None, memory_fraction=0.8, max_slots=8,
                          reading=fake(int(SLOT * 1.2)))
    assert e.value.session_bytes == SLOT and e.value.budget_bytes == int(0.8 * int(SLOT * 1.2))
    assert "--memory-fraction" in str(e.value) and "AttentionRingSpec" in str(e.value)
    with pytest.raises(DeviceTooSmall, match="--state-budget-mib"):
        plan_state_memory(STATES, state_budget_bytes=SLOT - 1, memory_fraction=0.8, max_slots=8, reading=None)
    for bad in ({"memory_fraction": 0.0}, {"memory_fraction": 1.5}, {"max_slots": 0}):
        kw = {"state_budget_bytes": None, "memory_fraction": 0.8, "max_slots": 8, "reading": fake(SLOT * 4)}
        with pytest.raises(ValueError):
            plan_state_memory(STATES, **{**kw, **bad})  # type: ignore[arg-type]


def test_the_host_reading_parses_meminfo(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   12000000 kB\n")
    r = read_device_memory(torch.device("cpu"), meminfo=info)
    assert (r.free_bytes, r.total_bytes) == (12000000 * 1024, 24000000 * 1024) and "MemAvailable" in r.source
    real = read_device_memory(torch.device("cpu"))
    assert 0 < real.free_bytes <= real.total_bytes


def test_the_worker_sizes_its_pool_from_the_reading_and_plans_activations(model, caplog) -> None:  # type: ignore[no-untyped-def]
    slot = model.spec.state_bytes_per_session()
    asked: list[tuple[int, int]] = []
    model.plan_activation_memory = lambda *, available_bytes, max_batch: (  # type: ignore[method-assign]
        asked.append((available_bytes, max_batch)) or "decode: planned")
    try:
        with caplog.at_level(logging.INFO, logger="worldcast.engine.device_worker"):
            w = DeviceWorker(model, EngineConfig(memory_fraction=0.5, max_batch=2, torch_threads=1),
                             on_frames=lambda f: None, on_error=lambda s, r: None,
                             memory_reader=lambda dev: fake(slot * 8 + 100))
    finally:
        del model.plan_activation_memory
    assert w.pool.num_slots == 4 and w.snapshot.slots_total == 4
    assert asked == [(slot * 8 + 100 - 4 * slot, 2)]
    assert any("holds 4 session(s)" in r.message for r in caplog.records)
    assert any("decode: planned" in r.message for r in caplog.records)
    with pytest.raises(DeviceTooSmall):
        DeviceWorker(model, EngineConfig(memory_fraction=0.5, torch_threads=1), on_frames=lambda f: None,
                     on_error=lambda s, r: None, memory_reader=lambda dev: fake(slot))


def test_start_up_objects_frozen_out_of_collection_are_not_scanned_again() -> None:
    """After `freeze_startup_objects`, what existed is in the permanent generation (a full collection skips
    it) and what is made afterwards is collected as usual."""
    class Node:
        pass

    old = Node()
    try:
        frozen = freeze_startup_objects()
        # Not an equality: a frozen object another thread of this process frees meanwhile (an earlier test's engine
        # winding down) leaves the permanent generation, which made the count differ by 2, both ways, in two runs.
        assert frozen > 1000 and abs(gc.get_freeze_count() - frozen) < frozen // 100
        assert not any(o is old for o in gc.get_objects()), "a frozen object is no longer tracked for collection"
        new = Node()
        new.self = new  # a cycle: only the collector frees it
        assert any(o is new for o in gc.get_objects())
    finally:
        gc.unfreeze()  # the rest of the suite counts tracked objects
    assert any(o is old for o in gc.get_objects())

