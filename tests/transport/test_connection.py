"""The connection core (`transport/connection.py`): one close, one frame event, guarded dispatch.

A real `Session` of the shipped TinyWorld model (no engine: frames are delivered by hand) under a real
`Connection`; the sink is a recording one (no transport here).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from tests.fakes import FakeClock
from worldcast.engine.step_output import FrameOut
from worldcast.models.spec import ConditioningRequest
from worldcast.sessions.session import Session, SessionState
from worldcast.transport.connection import Connection, frame_event, frame_fields
from worldcast.transport.errors import INTERNAL_ERROR

pytestmark = pytest.mark.timeout(30)

EMB = np.zeros(384, np.float32)


class RecordingSink:
    """A `FrameSink` that keeps what it is handed."""

    def __init__(self) -> None:
        self.frames: list[Any] = []

    def put(self, frame: Any) -> None:
        self.frames.append(frame)

    def clear(self) -> None:
        self.frames.clear()


def make(model: Any) -> tuple[Session, Connection, list[dict[str, Any]], list[dict[str, Any]]]:
    s = Session("sid", "tok", model=model, conditioning=ConditioningRequest(text="a green meadow"),
                context={"prompt": EMB}, seed=0, clock=FakeClock())
    sent: list[dict[str, Any]] = []
    floods: list[dict[str, Any]] = []
    return s, Connection(s, send=sent.append, on_flood=floods.append), sent, floods


async def test_close_cancels_every_task_then_awaits_them_and_detaches_once(model) -> None:  # type: ignore[no-untyped-def]
    s, conn, _, _ = make(model)
    sink = RecordingSink()
    s.attach_sink(sink)
    states: list[object] = []
    conn.subscribe(s.on("state", lambda _s, st: states.append(st)))
    s.tick(s.clock() + 3600)
    assert states == [SessionState.IDLE]
    cleaned: list[str] = []

    async def worker(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits: finished before aclose returns
            cleaned.append(name)

    tasks = [conn.spawn(worker(n)) for n in ("a", "b")]
    await asyncio.sleep(0)
    after_ran = asyncio.Event()

    async def after() -> None:
        assert sorted(cleaned) == ["a", "b"], "the adapter's teardown ran before the tasks had ended"
        after_ran.set()

    assert await conn.aclose(sink=sink, after=after) is True
    assert all(t is not None and t.cancelled() for t in tasks) and sorted(cleaned) == ["a", "b"]
    assert after_ran.is_set() and conn.closed.is_set() and conn.feedback.closed
    assert s.sink_count == 0 and not conn.tasks
    s.activate()  # an event after the close reaches no one
    assert states == [SessionState.IDLE]
    assert await conn.aclose(sink=sink) is False  # idempotent: nothing is done twice
    assert s.state != SessionState.CLOSED  # the core closes the connection, never the session


async def test_a_second_close_waits_for_the_first_and_the_closing_task_is_not_cancelled(model) -> None:  # type: ignore[no-untyped-def]
    s, conn, _, _ = make(model)
    release = asyncio.Event()

    async def after() -> None:
        await release.wait()

    first = conn.spawn(conn.aclose(after=after))  # the close runs in one of the connection's own tasks
    await asyncio.sleep(0)
    second = asyncio.ensure_future(conn.aclose())
    await asyncio.sleep(0.01)
    assert first is not None and not first.done() and not second.done(), "the second close did not wait"
    release.set()
    assert await second is False
    assert await first is True and not first.cancelled()


async def test_nothing_is_spawned_once_closing(model) -> None:  # type: ignore[no-untyped-def]
    s, conn, _, _ = make(model)
    await conn.aclose()
    ran: list[int] = []

    async def late() -> None:
        ran.append(1)

    coro = late()
    assert conn.spawn(coro) is None
    await asyncio.sleep(0)
    assert ran == [] and coro.cr_frame is None  # closed, never run (and never "not awaited")


async def test_the_frame_event_is_one_shape_for_every_transport(model) -> None:  # type: ignore[no-untyped-def]
    s, _, _, _ = make(model)
    clock = s.clock
    h, w = model.spec.frame_height, model.spec.frame_width
    frame = s.frames.deliver(FrameOut("sid", 7, np.zeros((h, w, 3), np.uint8), 0.35, 3, s.inputs.current_epoch(),
                               {"denoise": 1.23456, "decode": 0.5}))
    assert frame is not None
    now = clock() + 0.0123456
    ev = frame_event(frame, now)
    assert list(ev) == ["event", "frame_index", "pts", "action_seq", "epoch", "lateness_ms", "timings_ms"]
    assert ev["event"] == "frame" and ev["action_seq"] == 3 and ev["frame_index"] == frame.frame_index
    assert ev["lateness_ms"] == round((now - frame.present_at_s) * 1e3, 2)
    assert ev["timings_ms"] == {"denoise": 1.23, "decode": 0.5}
    assert {k: v for k, v in ev.items() if k != "event"} == frame_fields(frame, now)
    json.dumps(ev, allow_nan=False)  # every value is plain JSON


async def test_a_failing_action_handler_is_answered_not_raised(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s, conn, sent, floods = make(model)

    def boom(*a: Any, **k: Any) -> list[dict[str, Any]]:
        raise RuntimeError("handler bug")

    monkeypatch.setattr(conn.actions, "receive", boom)
    conn.take_action('{"seq": 1, "t": 0, "keys": [], "mouse": [0, 0]}', 0.0)
    assert sent == [{"event": "action_rejected", "seq": None, "code": INTERNAL_ERROR, "message": "internal error"}]
    assert floods == []


async def test_rpc_dispatch_counts_the_reply_and_answers_a_failure(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s, conn, _, _ = make(model)
    reply = await conn.call({"id": 4, "method": "get_state"}, 0.0)
    assert reply is not None and reply["id"] == 4 and "result" in reply

    async def boom(request: Any) -> dict[str, Any]:
        raise RuntimeError("handler bug")

    monkeypatch.setattr(conn.rpc, "handle", boom)
    reply = await conn.call({"id": 5, "method": "get_state"}, 0.0)
    assert reply == {"id": 5, "error": {"code": INTERNAL_ERROR, "message": "internal error"}}
    raw = await conn.call(b'{"id": "r1", "method": "get_state"}', 0.0, raw=True)
    # undecoded bytes: the failure's reply still names the request (read from the raw head)
    assert raw == {"id": "r1", "error": {"code": INTERNAL_ERROR, "message": "internal error"}}
