"""DirectingSession: segments open, finish, get cut, and pass on only their own frames (no device)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tests.fakes import FakeClock
from worldcast.engine.step_output import FrameOut
from worldcast.models.spec import ConditioningRequest
from worldcast.sessions.directing import DirectingSession, Segment, SegmentEnd, director_of
from worldcast.sessions.errors import DirectingRefusal, SessionClosedError
from worldcast.sessions.session import CloseReason, Session, SessionState

EMB = np.zeros(384, np.float32)


class ListSink:
    def __init__(self) -> None:
        self.frames: list = []  # type: ignore[type-arg]
        self.clears = 0

    def put(self, frame) -> None:  # type: ignore[no-untyped-def]
        self.frames.append(frame)

    def clear(self) -> None:
        self.clears += 1


class Deferred:
    """Collects deferred callables; `run` plays them (the event loop's call_soon, by hand)."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def __call__(self, fn: Callable[[], None]) -> None:
        self.pending.append(fn)

    def run(self) -> None:
        fns, self.pending = self.pending, []
        for fn in fns:
            fn()


def make(model):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    s = Session("sid", "tok", model=model, conditioning=ConditioningRequest(text="a green meadow"),
                context={"prompt": EMB}, seed=0, clock=clock,
                mode="directing")
    defer = Deferred()
    d = DirectingSession(s, default_duration_s=0.25, defer=defer)  # 5 frames at 20 fps
    assert director_of(s) is d
    s.pause()
    return s, d, defer, clock


class Counter:
    def __init__(self) -> None:
        self.i = 0

    def __call__(self, s: Session, n: int = 1, *, epoch: int | None = None) -> list:  # type: ignore[type-arg]
        """Deliver n engine frames (one chunk's worth, as the engine does) under `epoch` (default: current)."""
        out = []
        for _ in range(n):
            self.i += 1
            e = s.inputs.current_epoch() if epoch is None else epoch
            out.append(s.frames.deliver(FrameOut("sid", self.i, np.zeros((64, 64, 3), np.uint8), self.i / 20, -1, e,
                                          {"denoise": 2.0, "decode": 1.0})))
        return out


def test_frames_flow_only_inside_a_segment_which_finishes_and_pauses(model) -> None:  # type: ignore[no-untyped-def]
    s, d, defer, clock = make(model)
    starts: list[Segment] = []
    ends: list[Segment] = []
    d.on("segment_start", starts.append)
    d.on("segment_complete", ends.append)
    sink = ListSink()
    s.attach_sink(sink)
    assert s.sink_count == 1 and not s.inputs.wants_frames(), "a directing session waits for its first direction"
    deliver = Counter()
    deliver(s, 2)
    assert sink.frames == [] and d.frames_dropped >= 2  # the initial frame and strays: no segment yet

    clock.advance(1.0)
    ack = d.direct("d1", "a snowy field", {"prompt": EMB})
    assert ack.cut is None and ack.segment.index == 0 and ack.segment.target_frames == 5
    assert s.prompt == "a snowy field" and s.inputs.wants_frames() and starts == [ack.segment]
    clock.advance(0.04)
    deliver(s, 4)
    deliver(s, 2)  # one chunk of two frames crosses the target: both belong to the segment
    assert defer.pending, "the segment ends after the rest of its chunk"
    defer.run()
    assert not s.inputs.wants_frames() and s.paused
    seg = ends[0]
    assert seg.end == SegmentEnd.FINISHED and seg.frames == 6 and len(sink.frames) == 6
    info = seg.summary(20)
    assert info["timings_ms"]["ttff"] == 40.0 and info["timings_ms"]["denoise"] == 2.0  # type: ignore[index]
    assert info["last_frame_index"] == 8 and info["end"] == "finished"
    deliver(s, 1)  # a chunk the engine had started before pausing: not part of any segment
    assert len(sink.frames) == 6


def test_a_new_direction_cuts_the_segment_and_old_frames_never_follow(model) -> None:  # type: ignore[no-untyped-def]
    s, d, defer, clock = make(model)
    ends: list[Segment] = []
    d.on("segment_complete", ends.append)
    sink = ListSink()
    s.attach_sink(sink)
    deliver = Counter()
    first = d.direct("d1", "a snowy field", {"prompt": EMB}, duration_s=10.0).segment
    deliver(s, 3)
    old_epoch = s.inputs.current_epoch()
    ack = d.direct("d2", "molten lava", {"prompt": EMB}, open_ended=True)
    assert ack.cut is first and first.end == SegmentEnd.CUT and ends == [first]
    assert first.last_frame_index == 3 and first.frames == 3
    assert ack.segment.target_frames is None and ack.segment.epoch > old_epoch
    assert sink.clears == 2, "each direction flushed the downstream sinks"
    n = len(sink.frames)
    assert deliver(s, 2, epoch=old_epoch) == [None, None]  # generated under d1, delivered late: dropped
    assert len(sink.frames) == n
    deliver(s, 50)  # open-ended: never finishes by itself
    defer.run()
    assert d.current is ack.segment and ack.segment.frames == 50
    assert all(f.epoch >= ack.segment.epoch for f in sink.frames[n:])
    s.flush()  # a flush RPC inside the segment keeps it (epochs only grow)
    deliver(s, 1)
    assert d.segment_for_epoch(s.inputs.current_epoch()) is ack.segment and ack.segment.frames == 51
    assert d.segment_for_epoch(old_epoch) is first and d.segment_for_epoch(-1) is None


def test_close_stops_the_open_segment_and_the_layer_lets_go(model) -> None:  # type: ignore[no-untyped-def]
    s, d, defer, clock = make(model)
    ends: list[Segment] = []
    d.on("segment_complete", ends.append)
    a = ListSink()
    s.attach_sink(a)  # sinks attach to the session, as for any session: the layer gates what they get
    s.detach_sink(a)
    assert s.sink_count == 0 and s.state == SessionState.IDLE
    s.attach_sink(a)
    seg = d.direct("d1", "x", {"prompt": EMB}).segment
    s.close(CloseReason.CLIENT)
    assert ends == [seg] and seg.end == SegmentEnd.STOPPED and director_of(s) is None
    with pytest.raises(SessionClosedError):
        d.direct("d2", "y", {"prompt": EMB})
    with pytest.raises(ValueError):
        DirectingSession(make(model)[0])  # one gate per session


def test_pause_resume_and_control_rules(model) -> None:  # type: ignore[no-untyped-def]
    s, d, defer, clock = make(model)
    with pytest.raises(DirectingRefusal, match="first direction"):
        d.resume()
    with pytest.raises(DirectingRefusal, match="set_prompt"):
        d.check_control("set_prompt")
    d.check_control("flush")  # the rest act on the session as they are
    seg = d.direct("d1", "x", {"prompt": EMB}).segment
    d.pause()
    assert s.paused and seg.open
    assert d.resume() is True and not s.paused
    d.halt()
    assert d.resume() is False and s.cancelled  # an ended segment stays ended


def test_segment_lengths_round_up_to_whole_frames(model) -> None:  # type: ignore[no-untyped-def]
    _, d, _, _ = make(model)
    assert [d.target_frames(x) for x in (0.001, 0.05, 0.051, 1.0, None)] == [1, 1, 2, 20, 5]
    with pytest.raises(ValueError):
        DirectingSession(d.session, default_duration_s=0)


def test_halt_ends_the_segment_now_and_drops_its_frames_until_the_next_direction(model) -> None:  # type: ignore[no-untyped-def]
    s, d, defer, clock = make(model)
    ends: list[Segment] = []
    d.on("segment_complete", ends.append)
    sink = ListSink()
    s.attach_sink(sink)
    deliver = Counter()
    seg = d.direct("d1", "a snowy field", {"prompt": EMB}, duration_s=10.0).segment
    deliver(s, 3)
    old_epoch = s.inputs.current_epoch()
    assert d.halt() is seg and seg.end == SegmentEnd.CUT and ends == [seg] and d.current is None
    assert s.cancelled and not s.inputs.wants_frames() and sink.clears == 2  # queued frames dropped downstream
    n = len(sink.frames)
    deliver(s, 2, epoch=old_epoch)
    assert len(sink.frames) == n and seg.frames == 3
    assert d.halt() is None  # nothing open: nothing to end
    nxt = d.direct("d2", "molten lava", {"prompt": EMB}).segment
    assert not s.cancelled and s.inputs.wants_frames() and nxt.index == 1
    s.close(CloseReason.CLIENT)
    with pytest.raises(SessionClosedError):
        d.halt()


def test_a_gated_frame_is_neither_delivered_nor_emitted_and_is_counted_as_gated(model) -> None:  # type: ignore[no-untyped-def]
    """A frame the directing gate refuses (no open segment) reaches no sink, raises no "frame" event (a WebRTC
    peer would announce video it never gets) and counts as `frames_dropped_gated`, not `frames_delivered`;
    the gate's own drop count and a stale frame's counter are unchanged in meaning."""
    s, d, defer, clock = make(model)
    sink = ListSink()
    s.attach_sink(sink)
    emitted: list[int] = []
    s.on("frame", lambda sess, f: emitted.append(f.frame_index))  # type: ignore[attr-defined]
    deliver = Counter()
    assert deliver(s, 3) == [None, None, None]
    assert sink.frames == [] and emitted == [] and s.frames.delivered == 0
    assert s.frames.dropped_gated == 3 == d.frames_dropped and s.frames.dropped_stale == 0
    assert s.info()["frames_dropped_gated"] == 3
    d.direct("d1", "a snowy field", {"prompt": EMB})
    got = deliver(s, 2)
    assert all(f is not None for f in got) and emitted == [f.frame_index for f in got] == [4, 5]
    assert s.frames.delivered == 2 == len(sink.frames) and s.frames.dropped_gated == 3
    assert deliver(s, 1, epoch=0) == [None] and s.frames.dropped_stale == 1, "an older epoch: stale, not gated"
    assert s.frames.dropped_gated == 3 and s.frames.generated == 6
