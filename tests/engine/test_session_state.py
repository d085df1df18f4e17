"""A session's state as bytes: captured at a chunk boundary, restored on another engine, byte-identical,
and its frames go on exactly as an unmoved twin's (same seed, same actions)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.fake_models import PaletteWorld
from tests.fakes import ScriptedConditioner
from worldcast.engine import session_state
from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.errors import SessionStateError
from worldcast.engine.step_output import FrameOut, StepRunnerOutput
from worldcast.engine.step_scheduler import Phase, SchedulerConfig, SessionSchedule, StepScheduler

FRAMES = 16  #: frames compared per session


class Frames:
    def __init__(self) -> None:
        self.by_index: dict[int, np.ndarray] = {}
        self.present: dict[int, float] = {}
        self.errors: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def on_frames(self, frames: list[FrameOut]) -> None:
        with self.lock:
            for f in frames:
                assert f.frame_index not in self.by_index, f"frame {f.frame_index} published twice"
                self.by_index[f.frame_index] = f.image.copy()
                self.present[f.frame_index] = f.present_at_s

    def on_error(self, sid: str, reason: str) -> None:
        self.errors.append((sid, reason))

    def count(self) -> int:
        with self.lock:
            return len(self.by_index)


def wait_for(cond, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def worker(model, rec: Frames) -> DeviceWorker:  # type: ignore[no-untyped-def]
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 2, max_batch=1,
                                         torch_threads=1), on_frames=rec.on_frames, on_error=rec.on_error)
    w.start()
    return w


def export(w: DeviceWorker, sid: str, *, detach: bool = True) -> bytes:
    got: list[tuple[bytes | None, str | None]] = []
    w.export_session(sid, lambda b, e: got.append((b, e)), detach=detach)
    wait_for(lambda: bool(got))
    blob, err = got[0]
    assert err is None and blob is not None
    return blob


def test_a_moved_session_has_identical_state_and_continues_as_its_unmoved_twin(model) -> None:  # type: ignore[no-untyped-def]
    twin_rec = Frames()
    t = worker(model, twin_rec)
    try:
        t.add_session("x", ScriptedConditioner(keys={"d": True}), seed=5)
        wait_for(lambda: twin_rec.count() >= FRAMES)
    finally:
        t.stop()

    a_rec, b_rec = Frames(), Frames()
    a, b = worker(model, a_rec), worker(model, b_rec)
    try:
        a.add_session("x", ScriptedConditioner(keys={"d": True}), seed=5)
        wait_for(lambda: a_rec.count() >= 5)
        blob = export(a, "x")  # at its next chunk boundary; it leaves engine A
        wait_for(lambda: a.pool.used_slots == 0)
        n_a = a_rec.count()
        restored: list[bytes] = []
        b.add_session("x", ScriptedConditioner(keys={"d": True}), seed=999, state=blob, verify=True,
                      on_restored=lambda state, error: restored.append(state or error))
        wait_for(lambda: b_rec.count() >= FRAMES - n_a)
        assert restored == [blob], "the state captured on B right after the restore differs from what left A"
        assert a_rec.count() == n_a, "engine A generated for the session after it left"
    finally:
        a.stop()
        b.stop()
    assert not (a_rec.errors or b_rec.errors or twin_rec.errors)
    a_idx, b_idx = sorted(a_rec.by_index), sorted(b_rec.by_index)
    assert a_idx == list(range(n_a)) and b_idx[0] == n_a, "frames continue at the next index, none lost or repeated"
    assert b_rec.present[b_idx[0]] > a_rec.present[a_idx[-1]], "presentation times go on after the move"
    for i in range(FRAMES):
        got = a_rec.by_index.get(i, b_rec.by_index.get(i))
        assert got is not None and np.array_equal(got, twin_rec.by_index[i]), f"frame {i} differs from the twin's"


def test_capture_restore_capture_is_the_identity_and_says_what_it_holds(model) -> None:  # type: ignore[no-untyped-def]
    rec = Frames()
    a = worker(model, rec)
    try:
        a.add_session("y", ScriptedConditioner(), seed=3)
        wait_for(lambda: rec.count() >= 3)
        peek = export(a, "y", detach=False)  # a capture that leaves the session where it is
        wait_for(lambda: rec.count() >= 5)
        blob = export(a, "y")
    finally:
        a.stop()
    assert peek != blob  # it generated in between: the state moved on
    c = session_state.parse(blob, model.spec)
    assert c.header["session_id"] == "y" and c.header["seed"] == 3 and c.header["next_latent"] >= 4
    assert c.schedule.phase in (Phase.WAITING, Phase.IDLE) and c.schedule.frames >= 5
    assert c.conditioner is None  # a scripted conditioner has no state to carry
    assert len(blob) > model.spec.state_bytes_per_session()  # every declared byte, plus header and RNG
    assert set(c.parts) >= {f"state/{s.name}/{t}" for s in model.spec.states for t in s.tensors()} | {"rng"}


def test_state_of_another_model_or_not_a_state_is_refused_before_anything_is_reserved(model) -> None:  # type: ignore[no-untyped-def]
    rec = Frames()
    a = worker(model, rec)
    try:
        a.add_session("z", ScriptedConditioner(), seed=1)
        wait_for(lambda: rec.count() >= 2)
        blob = export(a, "z")
        free = a.free_slots
        with pytest.raises(SessionStateError, match="not a worldcast session state"):
            a.add_session("w", ScriptedConditioner(), seed=1, state=b"junk-junk-junk")
        with pytest.raises(SessionStateError, match="truncated"):
            a.add_session("w", ScriptedConditioner(), seed=1, state=blob[:-10])
        assert a.free_slots == free
        with pytest.raises(SessionStateError, match="cannot move"):
            session_state.parse(blob, PaletteWorld().spec)
        got: list[tuple[bytes | None, str | None]] = []
        a.export_session("nobody", lambda b, e: got.append((b, e)))
        wait_for(lambda: bool(got))
        assert got[0][0] is None and "no session nobody" in str(got[0][1])
    finally:
        a.stop()


def test_the_scheduler_restores_a_moved_schedule_unchanged() -> None:
    s = StepScheduler(SchedulerConfig(frame_period_s=0.05, frames_per_chunk=1, denoising_steps=2))
    sched = SessionSchedule(Phase.WAITING, 0, deadline_s=10.0, start_at_s=9.95, frames=40, chunks=39, late_frames=2)
    s.restore("m", sched)
    assert s.schedule_of("m") == sched
    assert s.schedule(9.9).is_empty and s.schedule(9.96).session_ids == ["m"]
    s.add("n")  # a new session's deadlines go on the moved one's grid (it set the empty scheduler's origin)
    plan = s.schedule(9.96)
    assert plan.kind == "init" and plan.session_ids == ["n"]
    s.update_from_output(plan, StepRunnerOutput(0.0, [], {}, frames_by_session={"n": 1}), 9.96)
    k = (s.schedule_of("n").deadline_s - 10.0) / 0.05
    assert abs(k - round(k)) < 1e-6, k
    with pytest.raises(ValueError, match="mid-chunk"):
        s.restore("r", SessionSchedule(Phase.RUNNING, 1, 1.0, 1.0, 0, 0, 0))


def test_a_restored_session_is_not_fresh_for_inputs_from_before_its_move() -> None:
    """A moved session starts its next chunk early only on an input that came after the move (`early_start`)."""
    s = StepScheduler(SchedulerConfig(frame_period_s=0.05, frames_per_chunk=1, denoising_steps=2))
    s.cost.observe("denoise", 1, 0.001)
    s.cost.observe("commit", 1, 0.001)
    sched = SessionSchedule(Phase.WAITING, 0, deadline_s=10.0, start_at_s=9.99, frames=40, chunks=39, late_frames=2,
                            early_starts=3)
    s.restore("m", sched, epoch=2, input_version=7)
    assert s.schedule_of("m").early_starts == 3
    assert s.schedule(9.96).is_empty, "inputs counted before the move are not fresh"
    s.observe("m", 9.96, active=True, epoch=2, input_version=8)
    plan = s.schedule(9.96)
    assert plan.session_ids == ["m"] and plan.begin_chunk_ids == ["m"], "an input after the move starts it early"
