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


# -- one owner of phase and step; chunks that start when an input arrives (fake clock) ---------------------


def drive(s: StepScheduler, now: float, step_s: float = 0.005) -> tuple[float, list]:  # type: ignore[type-arg]
    """Run every ready step, each taking `step_s` of fake time; returns the time after and the plans."""
    plans = []
    while not (p := s.schedule(now)).is_empty:
        plans.append(p)
        now += step_s
        s.update_from_output(p, ok(step_s), now)
    return now, plans


def committed_one_chunk(s: StepScheduler, sid: str = "a") -> float:
    """Init `sid` and run its first chunk at its regular start; returns the time after its commit."""
    s.add(sid)
    now, _ = drive(s, 0.0)
    now, plans = drive(s, s.schedule_of(sid).start_at_s)
    assert [p.kind for p in plans] == ["denoise", "denoise", "commit"]
    return now


def test_the_plan_names_each_sessions_step_and_the_runner_keeps_no_count() -> None:
    s = make(steps=2)
    s.add("a")
    drive(s, 0.0)
    start = s.schedule_of("a").start_at_s
    p1 = s.schedule(start)
    assert p1.begin_chunk_ids == ["a"] and p1.steps == {"a": 0}
    s.update_from_output(p1, ok(), start)
    p2 = s.schedule(start)
    assert p2.begin_chunk_ids == [] and p2.steps == {"a": 1}
    s.update_from_output(p2, ok(), start)
    assert s.schedule(start).kind == "commit"


def test_a_flush_while_running_preempts_the_chunk_in_the_next_plan_and_starts_a_new_one() -> None:
    s = make()
    s.add("a")
    drive(s, 0.0)
    start = s.schedule_of("a").start_at_s
    p = s.schedule(start)
    s.update_from_output(p, ok(), start)
    assert s.phase("a") == Phase.RUNNING
    s.observe("a", start + 0.001, active=True, epoch=1, input_version=0)  # flush: the epoch moved
    p = s.schedule(start + 0.001)
    assert p.preempted_session_ids == ["a"]
    assert p.kind == "denoise" and p.begin_chunk_ids == ["a"] and p.steps == {"a": 0}
    s.update_from_output(p, ok(), start + 0.002)
    s.observe("a", start + 0.002, active=True, epoch=1, input_version=0)  # the new chunk saw epoch 1
    assert s.schedule(start + 0.002).preempted_session_ids == []


def test_a_pause_while_running_preempts_even_when_nothing_else_runs() -> None:
    s = make()
    s.add("a")
    drive(s, 0.0)
    start = s.schedule_of("a").start_at_s
    s.update_from_output(s.schedule(start), ok(), start)
    s.observe("a", start, active=False, epoch=0, input_version=0)
    p = s.schedule(start)
    assert p.is_empty and p.preempted_session_ids == ["a"] and s.phase("a") == Phase.IDLE
    assert s.schedule(start).preempted_session_ids == []  # named once


def test_an_input_on_an_idle_device_starts_the_next_chunk_at_once_on_its_grid_deadline() -> None:
    s = make(steps=2)
    after = committed_one_chunk(s)
    e = s.schedule_of("a")
    due = e.deadline_s - PERIOD - s.chunk_time_s(1)  # the previous frame is due from here on
    now = max(after, due) + 0.001
    assert now < e.start_at_s - 0.01, "the regular start is later"
    assert s.schedule(now).is_empty  # no input: it waits for its regular start
    s.observe("a", now, active=True, epoch=0, input_version=1)  # a key press
    p = s.schedule(now)
    assert p.kind == "denoise" and p.begin_chunk_ids == ["a"]
    assert p.deadlines_s["a"] == e.deadline_s, "the deadline stays on the grid: PTS one frame period apart"
    assert s.schedule_of("a").early_starts == 1


def test_an_input_before_the_previous_frame_is_due_waits_until_it_is() -> None:
    s = make(steps=2, frames_per_chunk=4)  # a long chunk period: the commit lands well before the next frame
    after = committed_one_chunk(s)
    e = s.schedule_of("a")
    due = e.deadline_s - PERIOD - s.chunk_time_s(1)
    assert after < due
    s.observe("a", after, active=True, epoch=0, input_version=1)
    early = s.schedule(after)
    assert early.is_empty and early.next_wake_s == pytest.approx(due), "it wakes when the previous frame is due"
    assert early.next_wake_s < e.start_at_s
    p = s.schedule(due)
    assert p.begin_chunk_ids == ["a"] and p.deadlines_s["a"] == e.deadline_s


def test_a_flush_of_a_waiting_session_is_a_fresh_input() -> None:
    s = make(steps=2)
    after = committed_one_chunk(s)
    e = s.schedule_of("a")
    now = max(after, e.deadline_s - PERIOD - s.chunk_time_s(1)) + 0.001
    s.observe("a", now, active=True, epoch=1, input_version=0)  # a direction: set_prompt + flush
    assert s.schedule(now).begin_chunk_ids == ["a"]


def test_under_load_an_input_does_not_move_a_chunk_ahead_of_another_sessions() -> None:
    s = make(max_batch=4, steps=2)
    s.add("a"), s.add("b")
    now, _ = drive(s, 0.0)
    now, plans = drive(s, s.schedule_of("a").start_at_s)
    assert all(p.session_ids == ["a", "b"] for p in plans)  # in lock step on one grid
    ea, eb = s.schedule_of("a"), s.schedule_of("b")
    assert ea.deadline_s == eb.deadline_s
    now = eb.start_at_s - 0.01  # a's chunk alone would still run when b's is due to start
    assert now >= ea.deadline_s - PERIOD - s.chunk_time_s(1)
    s.observe("a", now, active=True, epoch=0, input_version=1)
    assert s.schedule(now).is_empty, "it would delay b's chunk: the grid rules"
    p = s.schedule(eb.start_at_s)
    assert p.session_ids == ["a", "b"] and p.begin_chunk_ids == ["a", "b"]  # and they stay one batch
    off = make(steps=2, early_start=False)
    committed_one_chunk(off)
    e = off.schedule_of("a")
    off.observe("a", e.start_at_s - 0.002, active=True, epoch=0, input_version=1)
    assert off.schedule(e.start_at_s - 0.002).is_empty  # early start off: the grid alone


def test_inputs_at_any_time_keep_presentation_times_a_frame_period_apart_and_never_run_ahead() -> None:
    """However inputs arrive, each chunk's deadline is the previous one plus its frames, so PTS (derived from
    presentation times by the media clock) strictly increase at the frame rate; no chunk's frames come out
    before the previous frame is due, and early starts happen."""
    import random

    rng = random.Random(7)
    s = make(steps=2)
    s.add("a")
    now, _ = drive(s, 0.0)
    deadlines, version, t_input = [], 0, 0.0
    while len(deadlines) < 60:
        if now >= t_input:  # the next key press, 0-120 ms after the last
            version += 1
            t_input = now + rng.uniform(0.0, 0.12)
        s.observe("a", now, active=True, epoch=0, input_version=version)
        p = s.schedule(now)
        if p.is_empty:
            now = min(p.next_wake_s if p.next_wake_s is not None else t_input, t_input) + 1e-6
            continue
        if p.kind == "denoise" and p.begin_chunk_ids:
            deadlines.append(p.deadlines_s["a"])
            due = p.deadlines_s["a"] - PERIOD
            assert now + s.chunk_time_s(1) >= due - 1e-9, "frames out before the previous one is due"
        now += 0.005
        s.update_from_output(p, ok(), now)
    gaps = [b - a for a, b in zip(deadlines, deadlines[1:])]
    assert all(g == pytest.approx(PERIOD) or g > PERIOD for g in gaps)
    assert sum(1 for g in gaps if g == pytest.approx(PERIOD)) > 50  # on time: one period apart
    assert s.schedule_of("a").early_starts > 10
