"""StepScheduler policy with a fake clock: no device, no threads."""

import pytest

from worldcast.engine.cost_model import CostModel
from worldcast.engine.step_output import StepRunnerOutput
from worldcast.engine.step_scheduler import Phase, SchedulerConfig, StepScheduler

PERIOD = 0.05


def make(max_batch: int = 4, steps: int = 2, **config) -> StepScheduler:  # type: ignore[no-untyped-def]
    cost = CostModel()
    for b in range(1, 9):  # a known device: 5 ms per denoise step, 4 ms per commit, flat in batch
        cost.observe("denoise", b, 0.005)
        cost.observe("commit", b, 0.004)
        cost.observe("init", b, 0.004)
    return StepScheduler(SchedulerConfig(frame_period_s=PERIOD, frames_per_chunk=config.pop("frames_per_chunk", 1),
                                         denoising_steps=steps, max_batch=max_batch, **config), cost)


def ok(step_s: float = 0.005) -> StepRunnerOutput:
    return StepRunnerOutput(step_time_s=step_s, frames=[], failed={})


def run_until_empty(s: StepScheduler, now: float) -> list:
    plans = []
    while not (p := s.schedule(now)).is_empty:
        plans.append(p)
        s.update_from_output(p, ok(), now)
    return plans


def test_new_sessions_init_one_at_a_time_then_wait() -> None:
    s = make()
    s.add("a"), s.add("b")
    plans = run_until_empty(s, 0.0)
    assert [(p.kind, p.session_ids) for p in plans] == [("init", ["a"]), ("init", ["b"])]
    assert s.phase("a") == Phase.WAITING
    empty = s.schedule(0.0)
    assert empty.is_empty and empty.next_wake_s is not None and empty.next_wake_s >= 0.0


def test_chunks_start_as_late_as_safely_possible() -> None:
    s = make(steps=2)
    s.add("a")
    run_until_empty(s, 0.0)
    wake = s.schedule(0.0).next_wake_s
    plan = s.schedule(wake)
    assert plan.kind == "denoise" and plan.begin_chunk_ids == ["a"]
    chunk_s = 2 * 0.005 + 0.004
    # it starts no earlier than its deadline minus the (padded) chunk time
    assert plan.deadlines_s["a"] - wake == pytest.approx(chunk_s * s.config.safety + s.config.margin_s, abs=1e-9)
    s.update_from_output(plan, ok(), wake)
    p2 = s.schedule(wake)
    s.update_from_output(p2, ok(), wake)
    p3 = s.schedule(wake)
    assert p3.kind == "commit"
    s.update_from_output(p3, ok(), wake)
    # the next chunk waits for its own slot one frame period later
    nxt = s.schedule(wake).next_wake_s
    lead = s.chunk_time_s(1) * s.config.safety + s.config.margin_s
    assert nxt == pytest.approx(plan.deadlines_s["a"] + PERIOD - lead, abs=1e-9)
    assert nxt > wake + PERIOD / 2


def test_ready_steps_batch_across_sessions_up_to_max_batch() -> None:
    s = make(max_batch=2)
    for sid in "abc":
        s.add(sid)
    run_until_empty(s, 0.0)
    plan = s.schedule(1.0)
    assert plan.kind == "denoise" and len(plan.session_ids) == 2
    unbatched = make(max_batch=1)
    for sid in "abc":
        unbatched.add(sid)
    run_until_empty(unbatched, 0.0)
    assert len(unbatched.schedule(1.0).session_ids) == 1


def test_earliest_deadline_goes_first() -> None:
    s = make(max_batch=1)
    s.add("z_early")
    run_until_empty(s, 0.0)
    s.add("a_late")  # sorts first by name, but its first frame is due a second later
    init = s.schedule(1.0)
    assert (init.kind, init.session_ids) == ("init", ["a_late"])
    s.update_from_output(init, ok(), 1.0)
    assert s.schedule_of("a_late").deadline_s > s.schedule_of("z_early").deadline_s + 0.9
    assert s.schedule(5.0).session_ids == ["z_early"]  # both overdue: the earlier deadline runs


def test_late_session_is_rebased_instead_of_building_a_backlog() -> None:
    s = make(max_batch=1, steps=1)
    s.add("a")
    run_until_empty(s, 0.0)
    t = s.schedule(0.0).next_wake_s
    for _ in range(2):  # denoise + commit, finishing 1 s late
        p = s.schedule(t)
        s.update_from_output(p, ok(), t + 1.0)
    e = s.schedule_of("a")
    assert e.late_frames == 1
    assert e.deadline_s > t + 1.0  # rebased to the future, not 20 frames behind
    assert s.schedule(t + 1.0).session_ids == ["a"]  # and starts at once


def test_idle_sessions_are_not_scheduled_and_resume_fresh() -> None:
    s = make()
    s.add("a")
    run_until_empty(s, 0.0)
    p = s.schedule(10.0)
    s.update_from_output(p, ok(), 10.0)
    assert s.phase("a") == Phase.RUNNING
    assert s.set_active("a", False, 10.0) is True  # a staged chunk must be dropped
    assert s.schedule(20.0).is_empty and s.schedule(20.0).next_wake_s is None
    s.set_active("a", True, 30.0)
    p = s.schedule(30.0)
    assert p.kind == "denoise" and p.begin_chunk_ids == ["a"]


def test_restart_chunk_drops_the_running_chunk_and_restarts_now() -> None:
    s = make()
    s.add("a")
    run_until_empty(s, 0.0)
    p = s.schedule(10.0)
    s.update_from_output(p, ok(), 10.0)
    assert s.restart_chunk("a", 10.01) is True
    p = s.schedule(10.01)
    assert p.begin_chunk_ids == ["a"] and s.steps_done("a") == 0


def test_failed_session_is_removed_and_others_advance() -> None:
    s = make()
    s.add("a"), s.add("b")
    run_until_empty(s, 0.0)
    p = s.schedule(5.0)
    assert set(p.session_ids) == {"a", "b"}
    s.update_from_output(p, StepRunnerOutput(step_time_s=0.01, frames=[], failed={"a": "boom"}), 5.0)
    assert "a" not in s and s.steps_done("b") == 1


def test_cost_model_interpolates_and_extrapolates() -> None:
    c = CostModel()
    c.observe("denoise", 1, 0.010)
    c.observe("denoise", 4, 0.016)
    assert c.predict("denoise", 2) == pytest.approx(0.012)
    assert c.predict("denoise", 8) == pytest.approx(0.032)
    assert c.predict("commit", 1) == c.prior_s


def test_config_rejects_zero_batch() -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(frame_period_s=0.05, frames_per_chunk=1, denoising_steps=2, max_batch=0)


def test_a_chunk_due_soon_joins_the_batch_now() -> None:
    for lag, joins in ((0.4, True), (0.9, False)):  # b's chunk is due `lag` frame periods after a's
        s = make(max_batch=4, align_to_grid=False)
        s.add("a")
        run_until_empty(s, 0.0)
        s.add("b")
        run_until_empty(s, lag * PERIOD)
        start = s.schedule_of("a").start_at_s
        assert s.schedule_of("b").start_at_s == pytest.approx(start + lag * PERIOD, abs=1e-9)
        plan = s.schedule(start)
        assert plan.session_ids == (["a", "b"] if joins else ["a"]), f"lag {lag} periods"
        assert plan.begin_chunk_ids == plan.session_ids
    unbatched = make(max_batch=1)
    unbatched.add("a")
    run_until_empty(unbatched, 0.0)
    early = unbatched.schedule_of("a").start_at_s - 0.1 * PERIOD
    assert unbatched.schedule(early).is_empty  # without batching nothing starts early


def test_sessions_added_out_of_phase_share_one_deadline_grid_and_batch() -> None:
    s = make(max_batch=4)
    s.add("a")
    run_until_empty(s, 0.0)
    s.add("b")
    run_until_empty(s, 0.013)  # b's initial frame lands 13 ms (about a quarter period) later
    ea, eb = s.schedule_of("a"), s.schedule_of("b")
    offset = (eb.deadline_s - ea.deadline_s) / PERIOD
    assert offset == pytest.approx(round(offset), abs=1e-9)  # same phase
    # at a's start time both chunks are due within a frame, so they run as one batch from then on
    for _ in range(3):
        ea, eb = s.schedule_of("a"), s.schedule_of("b")
        plans = run_until_empty(s, max(ea.start_at_s, eb.start_at_s))
        assert plans and all(p.session_ids == ["a", "b"] for p in plans)
    unaligned = StepScheduler(SchedulerConfig(frame_period_s=PERIOD, frames_per_chunk=1, denoising_steps=2,
                                              align_to_grid=False), s.cost)
    unaligned.add("a")
    run_until_empty(unaligned, 0.0)
    unaligned.add("b")
    run_until_empty(unaligned, 0.013)
    ua, ub = unaligned.schedule_of("a"), unaligned.schedule_of("b")
    assert (ub.deadline_s - ua.deadline_s) / PERIOD % 1 == pytest.approx(0.26, abs=1e-6)


def test_a_flush_starts_at_once_with_its_deadline_on_the_grid() -> None:
    s = make()
    s.add("a")
    run_until_empty(s, 0.0)
    origin = s.schedule_of("a").deadline_s
    s.restart_chunk("a", 0.137)
    e = s.schedule_of("a")
    assert e.start_at_s == 0.137
    assert ((e.deadline_s - origin) / PERIOD) == pytest.approx(round((e.deadline_s - origin) / PERIOD), abs=1e-9)
    assert e.deadline_s >= 0.137 + s.chunk_time_s(1)


def test_a_longer_first_chunk_moves_the_next_deadline_by_its_own_pixel_frames() -> None:
    """Causal Wan: the first chunk decodes to 9 pixel frames, later ones to 12."""
    s = make(max_batch=1, steps=1, frames_per_chunk=12, first_chunk_frames=9)
    s.add("a")
    run_until_empty(s, 0.0)
    d0 = s.schedule_of("a").deadline_s
    t = s.schedule_of("a").start_at_s
    for _ in range(2):  # denoise, commit
        s.update_from_output(s.schedule(t), ok(), t)
    e = s.schedule_of("a")
    assert (e.frames, e.chunks) == (9, 1)
    assert e.deadline_s == pytest.approx(d0 + 9 * PERIOD)
    t = e.start_at_s
    for _ in range(2):
        s.update_from_output(s.schedule(t), ok(), t)
    assert s.schedule_of("a").deadline_s == pytest.approx(d0 + 21 * PERIOD) and s.schedule_of("a").frames == 21


def test_cost_samples_are_recorded_as_the_batches_actually_ran() -> None:
    s = make(max_batch=4)
    before = s.cost.snapshot()
    s.add("a"), s.add("b")
    run_until_empty(s, 0.0)
    plan = s.schedule(5.0)
    assert plan.session_ids == ["a", "b"]
    # the batch of two failed and was re-run as two batches of one: no sample claims batch size 2
    s.update_from_output(plan, StepRunnerOutput(step_time_s=0.5, frames=[], failed={},
                                                cost_samples=[("denoise", 1, 0.007), ("denoise", 1, 0.009)]), 5.0)
    after = s.cost.snapshot()
    assert after[("denoise", 2)] == before[("denoise", 2)]
    assert after[("denoise", 1)][1] == before[("denoise", 1)][1] + 2
