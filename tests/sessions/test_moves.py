"""SessionManager over several engines: placement, moves at a chunk boundary, drain, an engine lost."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.engine.device_worker import EngineConfig
from worldcast.engine.local_engine import LocalEngine
from worldcast.sessions import moves
from worldcast.sessions.errors import CapacityExhausted, EngineNotFound, MoveFailed
from worldcast.sessions.manager import SessionConfig, SessionManager
from worldcast.sessions.session import CloseReason, SessionFailure, SessionState


class ListSink:
    def __init__(self) -> None:
        self.frames: list = []  # type: ignore[type-arg]

    def put(self, frame) -> None:  # type: ignore[no-untyped-def]
        self.frames.append(frame)

    def clear(self) -> None:
        pass


async def until(cond, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def manager(model, engines: int = 2, max_sessions: int = 8, slots: int = 2,  # type: ignore[no-untyped-def]
            kind: type[LocalEngine] = LocalEngine) -> SessionManager:
    cfg = EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * slots, max_batch=2, torch_threads=1)
    return SessionManager(model, engine_config=cfg, engines=[kind(i, model, cfg) for i in range(engines)],
                          config=SessionConfig(tick_s=3600, warmup=False, admission=AdmissionConfig(
                              policy=AdmissionPolicy.STATIC, max_sessions=max_sessions)))


async def test_sessions_spread_over_engines_and_one_moves_on_without_a_gap(model) -> None:  # type: ignore[no-untyped-def]
    m = manager(model)
    await m.start()
    try:
        a, b = await m.create(seed=1), await m.create(seed=2)
        assert (a.engine_id, b.engine_id) == (0, 1) and a.info()["engine"] == 0
        sink = ListSink()
        a.attach_sink(sink)
        await until(lambda: len(sink.frames) >= 4)
        report = await moves.move_session(m, a.id, to=1, verify=True)
        assert report.identical is True and (report.source, report.target) == (0, 1) and report.state_bytes > 0
        assert a.engine_id == 1 and m.engine_of(a.id) is m.engines[1] and a.id in m.engines[1].session_ids
        n = len(sink.frames)
        await until(lambda: len(sink.frames) >= n + 4)
        idx = [f.frame_index for f in sink.frames]
        pts = [f.pts for f in sink.frames]
        assert idx == list(range(idx[0], idx[0] + len(idx))), "no frame lost or repeated across the move"
        assert all(q > p for p, q in zip(pts, pts[1:])), "PTS strictly increase across the move"
        with pytest.raises(MoveFailed, match="on engine 1 already"):
            await moves.move_session(m, a.id, to=1)
        with pytest.raises(EngineNotFound):
            await moves.move_session(m, a.id, to=7)
        c = await m.create(seed=3)  # engine 1 is full now (2 slots): c goes to 0
        assert c.engine_id == 0
        with pytest.raises(MoveFailed, match="no free state slot"):
            await moves.move_session(m, c.id, to=1)
        assert c.engine_id == 0 and c.state != SessionState.CLOSED, "a refused move leaves the session where it was"
    finally:
        await m.aclose()


async def test_drain_moves_every_session_off_and_placement_skips_the_engine_until_undrained(model) -> None:  # type: ignore[no-untyped-def]
    m = manager(model, slots=3)
    await m.start()
    try:
        ss = [await m.create(seed=i) for i in range(3)]
        assert [s.engine_id for s in ss] == [0, 1, 0]
        for s in ss:
            s.attach_sink(ListSink())
        report = await moves.drain(m, 0)
        assert sorted(r.session_id for r in report.moved) == sorted([ss[0].id, ss[2].id])
        assert not report.stayed and all(s.engine_id == 1 for s in ss) and m.engines[0].session_ids == set()
        assert m.engines[1].free_slots == 0
        with pytest.raises(CapacityExhausted, match="draining"):
            await m.create(seed=9)  # engine 1 is full, engine 0 draining
        moves.undrain(m, 0)
        assert (await m.create(seed=9)).engine_id == 0
        sink = ListSink()
        ss[0].attach_sink(sink)
        await until(lambda: len(sink.frames) >= 3)  # a moved session still streams
    finally:
        await m.aclose()


async def test_a_restore_that_fails_on_the_target_fails_the_move_and_drain_reports_it(  # type: ignore[no-untyped-def]
        model, monkeypatch) -> None:
    """A move is done only once the target has restored the session: a restore that fails there (a fault
    injected into `session_state.restore`, a fake) is the move's error, not a 'moved' followed by a
    silent close; the session is closed with the reason, and drain lists it under `stayed`."""
    from worldcast.engine import session_state

    m = manager(model)
    await m.start()
    try:
        a, b = await m.create(seed=1), await m.create(seed=2)
        errors: list[object] = []
        a.on("error", lambda s, r: errors.append(r))
        sink = ListSink()
        a.attach_sink(sink)
        await until(lambda: len(sink.frames) >= 2)

        def broken(r, captured) -> None:  # type: ignore[no-untyped-def]
            raise RuntimeError("injected restore fault")

        monkeypatch.setattr(session_state, "restore", broken)
        with pytest.raises(MoveFailed, match="injected restore fault"):
            await moves.move_session(m, a.id, to=1)
        assert a.state == SessionState.CLOSED and a.close_reason == CloseReason.ERROR and a.id not in m.sessions
        assert [str(e) for e in errors] and all("injected restore fault" in str(e) for e in errors), errors
        assert a.id not in m.engines[1].session_ids and a.id not in m.engines[0].session_ids
        report = await moves.drain(m, 1)  # b, on engine 1, cannot move either
        assert report.moved == [] and "injected restore fault" in report.stayed[b.id]
    finally:
        await m.aclose()


async def test_a_lost_engine_fails_only_its_own_sessions_with_engine_lost(model) -> None:  # type: ignore[no-untyped-def]
    m = manager(model)
    await m.start()
    try:
        a, b = await m.create(seed=1), await m.create(seed=2)
        errors: list[object] = []
        a.on("error", lambda s, r: errors.append(r))
        sink = ListSink()
        b.attach_sink(sink)
        engine = m.engines[0]
        assert isinstance(engine, LocalEngine)
        await asyncio.get_running_loop().run_in_executor(None, engine.worker.stop)
        m.tick(m.clock())  # a thread's death is found by housekeeping
        assert engine.state == "lost" and engine.losses == 1
        assert len(errors) == 1 and isinstance(errors[0], SessionFailure) and errors[0].code == "engine_lost"
        assert "engine 0" in str(errors[0])
        assert a.state == SessionState.CLOSED and a.close_reason == CloseReason.ERROR and a.id not in m.sessions
        n = len(sink.frames)
        await until(lambda: len(sink.frames) >= n + 3)  # the other engine's session goes on
        assert b.state != SessionState.CLOSED
        c = await m.create(seed=3)  # placement skips the lost engine
        assert c.engine_id == 1 and not m.engines[0].ready and m.engines_up == 1 and m.ready
    finally:
        await m.aclose()


async def test_inputs_during_a_move_reach_the_target_and_a_cancelled_caller_does_not_strand_it(  # type: ignore[no-untyped-def]
        model) -> None:
    """An action pushed while the session is between engines is held and replayed onto the target once it is
    there, and is in the target's frames."""
    m = manager(model)
    await m.start()
    try:
        s = await m.create(seed=5)
        sink = ListSink()
        s.attach_sink(sink)
        await until(lambda: len(sink.frames) >= 2)
        pushed: list[object] = []
        target = m.engines[1]
        real_push = target.push_input

        def push_input(sid, delta) -> None:  # type: ignore[no-untyped-def]
            pushed.append((sid, delta))
            real_push(sid, delta)

        target.push_input = push_input  # type: ignore[method-assign]
        move = asyncio.create_task(moves.move_session(m, s.id, to=1))
        await asyncio.sleep(0)  # the move has begun: the session is between engines
        assert s.id in m.moving
        s.inputs.push(0, ["d"], (3.0, 0.0))
        move.cancel()  # the HTTP client went away
        with pytest.raises(asyncio.CancelledError):
            await move
        await until(lambda: s.id not in m.moving and s.engine_id == 1)
        want = [(s.id, ("d",), 0, (("pan_x", 3.0),))]
        assert [(sid, d.held, d.seq, d.moves) for sid, d in pushed] == want
        n = len(sink.frames)
        await until(lambda: len(sink.frames) >= n + 3)  # it generates on the target
        await until(lambda: any(f.action_seq == 0 for f in sink.frames[n:]))  # with the action pushed mid-move
    finally:
        await m.aclose()


async def test_a_move_that_cannot_capture_leaves_the_source_told_of_everything_meanwhile(model) -> None:  # type: ignore[no-untyped-def]
    """While a session is between engines its changes wait; when the source cannot capture it (a stalled engine
    fails the export), it stays there and gets what waited: the key pressed and the flush made meanwhile."""
    from worldcast.engine.errors import EngineUnavailable

    m = manager(model)
    await m.start()
    try:
        s = await m.create(seed=3)
        s.attach_sink(ListSink())
        src = m.engines[0]
        release = asyncio.Event()

        async def export_session(sid: str) -> bytes:
            await release.wait()
            raise EngineUnavailable("engine 0 is stalled: no progress for 9.9 s")

        src.export_session = export_session  # type: ignore[method-assign]
        move = asyncio.create_task(moves.move_session(m, s.id, to=1))
        await until(lambda: s.id in m.moving)  # the move has begun: it waits on the export
        s.inputs.push(0, ["d"], (0.0, 0.0))
        epoch = s.flush()
        release.set()
        with pytest.raises(MoveFailed, match="stalled"):
            await move
        cond = src.core.conditioner(s.id)  # type: ignore[attr-defined]
        assert s.engine_id == 0 and cond is not None
        st = cond.conditioner_state()
        assert st.held == ("d",) and st.epoch == epoch and st.wants_frames
    finally:
        await m.aclose()


async def test_a_session_removed_before_its_restore_fails_the_waiting_import(model) -> None:  # type: ignore[no-untyped-def]
    """An engine may drop an add that a removal overtook without a word: the import waiting on it fails instead of
    waiting for ever (a move of a session closed mid-way)."""
    from worldcast.engine.conditioner import ConditionerState
    from worldcast.engine.errors import EngineUnavailable

    cfg = EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session() * 2, max_batch=1, torch_threads=1)
    a, b = LocalEngine(0, model, cfg), LocalEngine(1, model, cfg)
    await a.start(warmup=False)
    try:
        prompt = np.zeros(model.spec.conditioning.tensors[0][1], np.float32)
        st = ConditionerState(epoch=0, wants_frames=True, context_version=0, context={"prompt": prompt})
        a.add_session("x", st, seed=1)
        blob = await a.export_session("x")
    finally:
        await a.aclose()
    b._loop = asyncio.get_running_loop()  # its worker is not started: the add waits in its queue
    imp = asyncio.create_task(b.import_session("x", st, seed=1, blob=blob))
    await until(lambda: b.holds("x"))  # the import has sent its add (which waits in the worker's queue)
    assert not imp.done()
    b.remove_session("x")
    with pytest.raises(EngineUnavailable, match="removed before its restore"):
        await asyncio.wait_for(imp, 5)
    assert not b.holds("x")
