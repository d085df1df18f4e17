"""Session state machine, conditioning, flush/cancel semantics (no device)."""

import numpy as np
import pytest

from tests.fakes import EngineSide, FakeClock
from worldcast.engine.step_output import FrameOut
from worldcast.models.spec import ConditioningRequest
from worldcast.sessions.errors import InvalidAction, SessionClosedError
from worldcast.sessions.session import CloseReason, Session, SessionState


class ListSink:
    def __init__(self) -> None:
        self.frames: list = []  # type: ignore[type-arg]

    def put(self, frame) -> None:  # type: ignore[no-untyped-def]
        self.frames.append(frame)
        del self.frames[:-2]

    def clear(self) -> None:
        self.frames.clear()


def make(model, clock=None) -> Session:  # type: ignore[no-untyped-def]
    return Session("sid", "tok", model=model, conditioning=ConditioningRequest(text="a green meadow"),
                   context={"prompt": np.zeros(384, np.float32)},
                   seed=0, idle_after_s=5.0, clock=clock or FakeClock())


def frame(idx: int, epoch: int, t: float = 0.0) -> FrameOut:
    return FrameOut("sid", idx, np.zeros((64, 64, 3), np.uint8), t, -1, epoch)


def test_lifecycle_and_events(model) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    s = make(model, clock)
    seen = []
    s.on("state", lambda sess, st: seen.append(st))
    assert s.state == SessionState.CREATED and not s.inputs.wants_frames()
    s.attach_sink(ListSink())
    assert s.state == SessionState.ACTIVE and s.inputs.wants_frames()
    clock.advance(6.0)
    s.tick(clock())
    assert s.state == SessionState.IDLE and not s.inputs.wants_frames()
    s.inputs.push(0, ["w"], (0, 0))
    assert s.state == SessionState.ACTIVE
    s.close(CloseReason.CLIENT)
    s.close(CloseReason.CLIENT)  # idempotent
    assert seen == [SessionState.ACTIVE, SessionState.IDLE, SessionState.ACTIVE, SessionState.CLOSED]
    with pytest.raises(SessionClosedError):
        s.inputs.push(1, [], (0, 0))


def test_async_callbacks_are_refused(model) -> None:  # type: ignore[no-untyped-def]
    async def cb(sess, st):  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(TypeError):
        make(model).on("state", cb)


def test_sample_chunk_encodes_held_keys_and_prompt(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    engine = EngineSide(s)
    s.inputs.push(3, ["d", "shift"], (8, 0))
    emb = np.ones(384, np.float32)
    s.set_prompt("lava", {"prompt": emb})
    ci = engine.cond.sample_chunk(1)
    assert ci.actions.shape == (1, 8) and ci.actions[0, 3] == 1 and ci.actions[0, 5] == 1
    assert ci.action_seq == 3 and ci.epoch == 0 and np.array_equal(ci.context["prompt"], emb)
    assert ci.context_version == 1 and s.prompt == "lava" and s.conditioning.text == "lava"


def test_flush_drops_queued_and_stale_frames(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    sink = ListSink()
    s.attach_sink(sink)
    s.frames.deliver(frame(1, 0, 1.0))
    assert len(sink.frames) == 1
    epoch = s.flush()
    assert epoch == 1 and sink.frames == []  # queue dropped
    assert s.frames.deliver(frame(2, 0, 1.05)) is None  # generated before the flush: never delivered
    delivered = s.frames.deliver(frame(3, 1, 1.10))
    assert delivered is not None and sink.frames[-1].frame_index == 3
    assert s.frames.dropped_stale == 1


def test_cancel_stops_until_resume_and_pause_keeps_queue(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    sink = ListSink()
    s.attach_sink(sink)
    s.frames.deliver(frame(1, 0))
    s.pause()
    assert not s.inputs.wants_frames() and len(sink.frames) == 1
    s.resume()
    assert s.inputs.wants_frames()
    s.cancel()
    assert not s.inputs.wants_frames() and sink.frames == []
    s.resume()
    assert s.inputs.wants_frames() and s.inputs.current_epoch() == 1


def test_pts_strictly_increase_across_deliveries(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    pts = [s.frames.deliver(frame(i, 0, 5.0 + i * 0.05)).pts for i in range(5)]  # type: ignore[union-attr]
    assert pts == [0, 4500, 9000, 13500, 18000]


def test_invalid_action_changes_nothing(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    s.inputs.push(0, ["w"], (1, 1))
    with pytest.raises(InvalidAction):
        s.inputs.push(1, ["w", "fly"], (0, 0))
    assert s.inputs.actions.last_seq == 0


def test_last_viewer_leaving_idles_the_session(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    engine = EngineSide(s)
    a, b = ListSink(), ListSink()
    s.attach_sink(a)
    s.attach_sink(b)
    s.inputs.push(0, ["w"], (0, 0))
    s.detach_sink(a)
    assert s.state == SessionState.ACTIVE and s.inputs.wants_frames()
    s.detach_sink(b)
    assert s.state == SessionState.IDLE and not s.inputs.wants_frames()
    assert not engine.cond.sample_chunk(1).actions[0, :4].any()  # held keys released
    assert not engine.cond.wants_frames(), "the engine was told the session is idle"


def test_each_action_goes_to_the_engine_after_the_session_is_active(model) -> None:  # type: ignore[no-untyped-def]
    """An idle device starts the next chunk when an input arrives: the session's inputs send each accepted action
    to the engine at once, after telling it the session wants frames (so the woken engine sees it ACTIVE); the
    engine counts the actions and a chunk reports the count it sampled at. A refused message sends nothing; an
    unchanged epoch, wants and conditioning are not sent again."""
    s = make(model)
    engine = EngineSide(s)
    assert engine.cond.input_version() == 0 and not engine.cond.wants_frames()
    s.inputs.push(0, ["w"], (0.0, 0.0))
    s.inputs.push(1, [], (3.0, 0.0))
    kinds = [type(m).__name__ for m in engine.log]
    assert kinds == ["ConditionerState", "InputDelta", "InputDelta"], kinds
    assert engine.log[0].wants_frames and engine.log[0].epoch == 0  # type: ignore[attr-defined]
    assert engine.cond.input_version() == 2 and engine.cond.sample_chunk(1).input_version == 2
    with pytest.raises(InvalidAction):
        s.inputs.push(-1, ["w"], (0.0, 0.0))
    assert len(engine.log) == 3 and engine.cond.input_version() == 2, "a refused message is not an input"
    s.flush()
    assert engine.cond.current_epoch() == 1 and len(engine.log) == 4
