"""DeviceWorker on a real thread with the shipped model: serving, cancel, failure isolation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from tests.fakes import ScriptedConditioner
from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.errors import StatePoolExhausted
from worldcast.engine.step_output import FrameOut


class Recorder:
    def __init__(self) -> None:
        self.frames: list[FrameOut] = []
        self.errors: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def on_frames(self, frames: list[FrameOut]) -> None:
        with self.lock:
            self.frames += frames

    def on_error(self, sid: str, reason: str) -> None:
        with self.lock:
            self.errors.append((sid, reason))

    def count(self, sid: str) -> int:
        with self.lock:
            return sum(1 for f in self.frames if f.session_id == sid)


def wait_for(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def worker(model):  # type: ignore[no-untyped-def]
    rec = Recorder()
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 3, max_batch=4,
                                         torch_threads=1), on_frames=rec.on_frames, on_error=rec.on_error)
    w.rec = rec  # type: ignore[attr-defined]
    w.start()
    yield w
    w.stop()


def test_serves_several_sessions_with_increasing_frames(worker) -> None:  # type: ignore[no-untyped-def]
    rec = worker.rec
    worker.add_session("a", ScriptedConditioner(), seed=1)
    worker.add_session("b", ScriptedConditioner(keys={"d": True}), seed=2)
    wait_for(lambda: rec.count("a") >= 6 and rec.count("b") >= 6)
    with rec.lock:
        for sid in "ab":
            idx = [f.frame_index for f in rec.frames if f.session_id == sid]
            assert idx == sorted(idx) and idx[0] == 0 and len(set(idx)) == len(idx)
            t = [f.present_at_s for f in rec.frames if f.session_id == sid]
            assert all(b > a for a, b in zip(t, t[1:]))
    assert worker.alive


def test_pool_exhaustion_is_refused_up_front(worker) -> None:  # type: ignore[no-untyped-def]
    for sid in "abc":
        worker.add_session(sid, ScriptedConditioner(), seed=0)
    with pytest.raises(StatePoolExhausted):
        worker.add_session("d", ScriptedConditioner(), seed=0)
    worker.remove_session("a")
    wait_for(lambda: worker.free_slots == 1)
    worker.add_session("d", ScriptedConditioner(), seed=0)


def test_cancel_takes_effect_within_one_step(worker) -> None:  # type: ignore[no-untyped-def]
    rec = worker.rec
    log: list[tuple[float, float, list[str], str | None]] = []
    real = worker.runner.execute

    def logged(plan, now_s):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        out = real(plan, now_s)
        log.append((t0, time.monotonic(), list(plan.session_ids), plan.kind))
        return out

    worker.runner.execute = logged
    cond = ScriptedConditioner()
    worker.add_session("a", cond, seed=0)
    worker.add_session("other", ScriptedConditioner(), seed=1)
    wait_for(lambda: rec.count("a") >= 4)
    # cancel while a chunk is in flight
    wait_for(lambda: worker.rollouts["a"].staged is not None, 10)
    with cond.lock:
        cond.active = False
        t_cancel = time.monotonic()
    worker.wake()
    n_other = rec.count("other")
    wait_for(lambda: rec.count("other") >= n_other + 4)
    started_after = [e for e in log if e[0] > t_cancel and "a" in e[2]]
    straddling = [e for e in log if e[0] <= t_cancel < e[1] and "a" in e[2]]
    assert started_after == [] and len(straddling) <= 1
    assert worker.rollouts["a"].staged is None


def test_a_failing_session_ends_alone(worker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rec = worker.rec
    bad = ScriptedConditioner()
    worker.add_session("good", ScriptedConditioner(), seed=0)
    worker.add_session("bad", bad, seed=1)
    wait_for(lambda: rec.count("bad") >= 2 and rec.count("good") >= 2)

    def boom(frames: int):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected failure")

    monkeypatch.setattr(bad, "sample_chunk", boom)
    wait_for(lambda: any(sid == "bad" for sid, _ in rec.errors))
    assert "injected failure" in dict(rec.errors)["bad"]
    n = rec.count("good")
    wait_for(lambda: rec.count("good") >= n + 5)
    assert "bad" not in worker.rollouts and worker.free_slots == 2 and worker.alive


def test_stopped_worker_reports_not_alive(model) -> None:  # type: ignore[no-untyped-def]
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session()),
                     on_frames=lambda f: None, on_error=lambda s, r: None)
    w.start()
    assert w.alive
    w.stop()
    assert not w.alive


def test_a_wake_that_arrives_during_a_pass_is_not_lost(model) -> None:  # type: ignore[no-untyped-def]
    """With nothing to do the worker sleeps for `idle_poll_s` (an hour here). A wake that arrives while it
    is polling (after it read the sessions, before it sleeps: an action pushed just then) must make it poll
    again at once, not sleep through the hour; several wakes before a poll cost one pass."""
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session(), torch_threads=1,
                                         idle_poll_s=3600), on_frames=lambda f: None, on_error=lambda s, r: None)
    polls: list[float] = []
    second = threading.Event()
    real_poll = w._poll_sessions

    def poll(now_s: float) -> None:
        real_poll(now_s)
        polls.append(now_s)
        if len(polls) == 1:
            w.wake()  # mid-pass: after this pass read the sessions
            w.wake()
        elif len(polls) == 2:
            second.set()

    w._poll_sessions = poll  # type: ignore[method-assign]
    w.start()
    try:
        assert second.wait(30), "the mid-pass wake was lost: the worker slept"
        time.sleep(0.2)  # an absence check: a third pass (a wake counted twice) would come at once
        assert len(polls) == 2, "two wakes before the poll cost one pass"
    finally:
        w.stop()


class SteerableClock:
    """The wall clock plus an offset a test adds to: an overrun is simulated by jumping it, not by sleeping."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return time.monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        with self.lock:
            self.offset += seconds


#: The step timeout of `strict_worker`: far above any real step on a busy machine, so only the
#: simulated overruns below cross it.
TIMEOUT_S = 5.0


@pytest.fixture
def strict_worker(model):  # type: ignore[no-untyped-def]
    """A worker whose timeouts are measured on a steerable clock."""
    rec = Recorder()
    clock = SteerableClock()
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 3, max_batch=4,
                                         torch_threads=1, step_timeout_s=TIMEOUT_S, stall_factor=2.0),
                     on_frames=rec.on_frames, on_error=rec.on_error, perf_clock=clock)
    w.rec, w.steer = rec, clock  # type: ignore[attr-defined]
    w.start()
    yield w
    w.stop()


def test_a_session_whose_conditioning_overruns_the_timeout_ends_alone(strict_worker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    w, rec = strict_worker, strict_worker.rec
    slow = ScriptedConditioner()
    w.add_session("good", ScriptedConditioner(), seed=0)
    w.add_session("slow", slow, seed=1)
    wait_for(lambda: rec.count("slow") >= 2 and rec.count("good") >= 2)
    real = slow.sample_chunk

    def stuck(frames: int):  # type: ignore[no-untyped-def]
        w.steer.jump(TIMEOUT_S * 1.5)  # sampling this session's conditioning "takes" 1.5 timeouts
        return real(frames)

    monkeypatch.setattr(slow, "sample_chunk", stuck)
    wait_for(lambda: any(sid == "slow" for sid, _ in rec.errors))
    assert "timed out" in dict(rec.errors)["slow"] and "sampling conditioning" in dict(rec.errors)["slow"]
    n = rec.count("good")
    wait_for(lambda: rec.count("good") >= n + 5)
    assert [sid for sid, _ in rec.errors] == ["slow"] and "slow" not in w.rollouts and w.alive


def test_an_overrunning_batch_isolates_its_sessions_and_ends_the_slow_one(strict_worker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import worldcast.engine.step_runner as dw

    w, rec = strict_worker, strict_worker.rec
    w.add_session("good", ScriptedConditioner(), seed=0)
    w.add_session("heavy", ScriptedConditioner(), seed=1)
    wait_for(lambda: rec.count("heavy") >= 2 and rec.count("good") >= 2)
    real = dw.denoise_batch
    batches: list[list[str]] = []

    def slow_when_heavy(rs, steps, cache=None):  # type: ignore[no-untyped-def]
        ids = [r.session_id for r in rs]
        batches.append(ids)
        if "heavy" in ids:
            w.steer.jump(TIMEOUT_S * 1.2)  # the forward "overruns" whenever this session is in it
        return real(rs, steps, cache)

    monkeypatch.setattr(dw, "denoise_batch", slow_when_heavy)
    wait_for(lambda: any(sid == "heavy" for sid, _ in rec.errors))
    assert "alone" in dict(rec.errors)["heavy"]
    n = rec.count("good")
    wait_for(lambda: rec.count("good") >= n + 5)
    assert [sid for sid, _ in rec.errors] == ["heavy"] and w.alive
    assert ["heavy"] in batches  # it was run alone before it was ended
    assert "good" not in w.runner.suspects  # cleared after running in time


def test_a_step_stuck_on_the_device_marks_the_worker_stalled(strict_worker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import worldcast.engine.step_runner as dw

    w = strict_worker
    w.add_session("a", ScriptedConditioner(), seed=0)
    wait_for(lambda: w.rec.count("a") >= 2)
    assert w.stalled_s == 0.0
    entered, release = threading.Event(), threading.Event()
    real = dw.denoise_batch

    def hang(rs, steps, cache=None):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(30)
        return real(rs, steps, cache)

    monkeypatch.setattr(dw, "denoise_batch", hang)
    assert entered.wait(30)
    assert w.stalled_s == 0.0  # running, but not yet for stall_factor timeouts
    w.steer.jump(TIMEOUT_S * 2.5)
    assert w.stalled_s > 0  # past stall_factor * timeout
    release.set()
    wait_for(lambda: w.stalled_s == 0.0)


def test_warmup_chooses_the_thread_count_by_timing_every_candidate(model) -> None:  # type: ignore[no-untyped-def]
    from worldcast.engine.tuning.threads import available_cores, eligible_threads

    before = torch.get_num_threads()
    rec = Recorder()
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 2, max_batch=1),
                     on_frames=rec.on_frames, on_error=rec.on_error)
    try:
        choice = w.choose_threads()
        cores = available_cores()
        assert choice.measured
        assert set(choice.chunk_s) == set(range(1, min(cores, 8) + 1)) or len(choice.chunk_s) == 8
        assert all(s > 0 for s in choice.chunk_s.values())
        assert 1 <= choice.threads <= eligible_threads(cores, 1)
        eligible = {n: s for n, s in choice.chunk_s.items() if n <= choice.eligible}
        assert choice.chunk_s[choice.threads] == min(eligible.values())
        assert torch.get_num_threads() == choice.threads
        assert w.pool.free_slots == w.pool.num_slots, "the timing session's slot is returned"
    finally:
        torch.set_num_threads(before)


def test_configured_threads_are_used_without_timing(model) -> None:  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    rec = Recorder()
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 2, torch_threads=1),
                     on_frames=rec.on_frames, on_error=rec.on_error)
    try:
        choice = w.choose_threads()
        assert (choice.threads, choice.measured, choice.chunk_s) == (1, False, {})
    finally:
        torch.set_num_threads(before)


def test_the_runner_carries_out_a_plan_literally(model) -> None:  # type: ignore[no-untyped-def]
    """It drops the chunks a plan preempts, begins the chunks it names, runs the step it names, and reports what
    each begun chunk was sampled under; it keeps no step count of its own."""
    from worldcast.engine.device_worker import StepRunner
    from worldcast.engine.rollout import ChunkRollout
    from worldcast.engine.state_pool import StatePool
    from worldcast.engine.step_output import StepSchedulerOutput

    pool = StatePool(model.spec.states, budget_bytes=model.spec.state_bytes_per_session() * 2)
    cond = ScriptedConditioner()
    cond.push_input()
    r = ChunkRollout("a", model, pool, cond, seed=0)
    r.init(0.0)
    runner = StepRunner({"a": r})
    plan = StepSchedulerOutput(kind="denoise", session_ids=["a"], begin_chunk_ids=["a"], deadlines_s={"a": 1.0},
                               next_wake_s=None, steps={"a": 0})
    out = runner.execute(plan, 0.5)
    assert r.staged is not None and r.staged.deadline_s == 1.0 and not out.failed
    assert out.began["a"].input_version == 1 and out.began["a"].epoch == 0
    first = r.staged.serial
    # the same session at its second step: not begun again, the named step runs
    runner.execute(StepSchedulerOutput(kind="denoise", session_ids=["a"], begin_chunk_ids=[], deadlines_s={"a": 1.0},
                                       next_wake_s=None, steps={"a": 1}), 0.51)
    assert r.staged.serial == first
    # a plan that preempts it (a flush), even with nothing to run
    runner.execute(StepSchedulerOutput.make_empty(None, ["a"]), 0.52)
    assert r.staged is None and r.next_latent == 1, "dropped; the session's state did not advance"


def test_a_slot_whose_removal_is_queued_is_free_for_the_next_add(model) -> None:  # type: ignore[no-untyped-def]
    """Issue 31, item 4: the server counts a slot free when it removes a session; the worker must too, before
    its loop comes round (here: not started), or the next add is refused after the server admitted it."""
    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 2),
                     on_frames=lambda f: None, on_error=lambda s, r: None)
    w.add_session("a", ScriptedConditioner(), seed=0)
    w.add_session("b", ScriptedConditioner(), seed=0)
    w._apply_pending()  # the loop's first pass: both hold slots
    assert w.pool.holds("a") and w.pool.holds("b") and w.free_slots == 0
    w.remove_session("a")  # queued: the loop is busy (here: not running)
    assert w.free_slots == 1
    w.add_session("c", ScriptedConditioner(), seed=0)  # the old count refused this: "all 2 state slots in use"
    w.remove_session("c")  # created and deleted before the loop came round: its reservation is free too
    w.add_session("d", ScriptedConditioner(), seed=0)
    with pytest.raises(StatePoolExhausted):
        w.add_session("e", ScriptedConditioner(), seed=0)
    w._apply_pending()  # removals first, then adds: no allocation fails
    assert sorted(w.rollouts) == ["b", "d"] and w.pool.used_slots == 2 and w.free_slots == 0


def test_a_session_removed_and_added_again_before_the_loop_comes_round_is_served(model) -> None:  # type: ignore[no-untyped-def]
    """A world put back (`SessionManager.rewind`: remove, then add the same id from its captured state) whose two
    requests one pass of the loop sees together: the add came after the removal, so it is served and its restore
    reported (the old pass skipped an add whose id was also being removed, and the restore waited for ever)."""
    from worldcast.engine import session_state

    w = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 2),
                     on_frames=lambda f: None, on_error=lambda s, r: None)
    w.add_session("a", ScriptedConditioner(), seed=3)
    w._apply_pending()
    r = w.rollouts["a"]
    r.init(0.0)
    blob = session_state.capture(r, w.scheduler.schedule_of("a"))
    restored: list[tuple[bytes | None, str | None]] = []
    w.remove_session("a")
    w.add_session("a", ScriptedConditioner(), seed=3, state=blob, on_restored=lambda b, e: restored.append((b, e)))
    assert w.free_slots == 1, "a's slot is leaving and its new add holds one"
    w._apply_pending()
    assert restored == [(None, None)] and "a" in w.rollouts and w.rollouts["a"] is not r
    assert w.rollouts["a"].next_latent == r.next_latent and w.pool.used_slots == 1
    # an add removed before any pass is dropped at once, its reservation with it
    w.add_session("b", ScriptedConditioner(), seed=0)
    w.remove_session("b")
    w._apply_pending()
    assert sorted(w.rollouts) == ["a"] and w.free_slots == 1


def test_the_engine_names_the_weights_as_it_serves_them() -> None:
    """A recording names the weights' digest as its engine serves them (an engine process holds its own copy in its
    served dtype, which the server's copy is not): `serve_way` (and warm-up) compute it after the dtype is applied."""
    from worldcast.engine.tuning.warmup import ServedWay
    from worldcast.models.base import weights_digest
    from worldcast.models.tinyworld import TinyWorldModel

    m = TinyWorldModel.from_pretrained()  # its own copy: the served dtype changes it
    loaded = weights_digest(m)
    w = DeviceWorker(m, EngineConfig(state_budget_bytes=m.spec.state_bytes_per_session()),
                     on_frames=lambda f: None, on_error=lambda s, r: None)
    assert w.weights_sha256 is None and w.snapshot.weights_sha256 is None  # no dtype chosen: as loaded
    w.serve_way(ServedWay("bfloat16"))
    assert w.weights_sha256 == weights_digest(m) != loaded
    w.serve_way(ServedWay("float32"))
    assert w.weights_sha256 == weights_digest(m)
