"""Viewer tokens, spectators (`sessions/viewers.py`) and the one token check (`sessions/access.py`), no network,
a fake clock."""

import asyncio

import pytest

from tests.fakes import FakeClock
from tests.sessions.test_session import ListSink, frame, make
from worldcast.sessions.access import authorize, count_spectators, token_opens_any
from worldcast.sessions.errors import SessionClosedError, SpectatorRefused, ViewerRefused
from worldcast.sessions.session import CloseReason, SessionState
from worldcast.sessions.viewers import (
    SPECTATOR_COST_CORES,
    SPECTATOR_CPU_SHARE,
    ViewerConfig,
    Viewers,
    own_encode_weight,
    spectator_cap,
)

CONFIG = ViewerConfig(min_ttl_s=10.0, default_ttl_s=60.0, max_ttl_s=600.0, max_tokens_per_session=2,
                      max_spectators_per_session=2, max_spectators=3)


def test_issue_find_revoke_and_expire() -> None:
    clock = FakeClock()
    vs = Viewers("sid", clock=clock)
    a = vs.issue(CONFIG)
    b = vs.issue(CONFIG, ttl_s=10.0)
    assert a.expires_at_s == clock() + 60.0 and a.token != b.token and a.viewer_id != b.viewer_id
    assert vs.find(a.token) is a and vs.find(b.token) is b and vs.find("nope") is None
    with pytest.raises(ViewerRefused, match="2 live viewer tokens"):
        vs.issue(CONFIG)
    clock.advance(10.0)  # b has run out: refused at once, and its place is free again
    assert vs.find(b.token) is None
    c = vs.issue(CONFIG)
    assert b.viewer_id not in vs.tokens and set(vs.tokens) == {a.viewer_id, c.viewer_id}
    assert vs.revoke(a.viewer_id) and not vs.revoke(a.viewer_id)  # idempotent
    assert vs.find(a.token) is None


@pytest.mark.parametrize("ttl_s", [9.99, 600.01, 0.0, -1.0])
def test_a_ttl_out_of_bounds_is_refused(ttl_s: float) -> None:
    vs = Viewers("sid", clock=FakeClock())
    with pytest.raises(ValueError, match=r"ttl_s must lie in \[10, 600\]"):
        vs.issue(CONFIG, ttl_s=ttl_s)
    assert len(vs) == 0


async def test_a_token_runs_out_on_its_timer_and_its_streams_close() -> None:
    vs = Viewers("sid", clock=FakeClock())
    v = vs.issue(ViewerConfig(min_ttl_s=0.01, default_ttl_s=0.01))
    closed = asyncio.Event()
    reasons: list[str] = []

    def close(reason: str) -> None:
        reasons.append(reason)
        closed.set()

    vs.admit(CONFIG, kind="fmp4", viewer=v, close=close, server_spectators=0)
    await asyncio.wait_for(closed.wait(), 5.0)
    assert reasons == ["expired"] and not vs.tokens and not vs.spectators


@pytest.mark.parametrize("bad", [{"stall_s": 0.0}, {"stall_s": float("inf")}, {"retry_after_s": -1.0},
                                 {"retry_after_s": float("nan")}])
def test_a_stall_or_retry_time_that_is_not_positive_and_finite_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="stall_s and retry_after_s must be positive and finite"):
        ViewerConfig(**bad)


def test_spectator_caps_per_session_and_per_server() -> None:
    vs = Viewers("sid", clock=FakeClock())
    v = vs.issue(CONFIG)
    one = vs.admit(CONFIG, kind="whep", viewer=v, close=lambda r: None, server_spectators=0)
    vs.admit(CONFIG, kind="fmp4", viewer=None, close=lambda r: None, server_spectators=1)
    with pytest.raises(SpectatorRefused, match="this session has 2 spectators") as e:
        vs.admit(CONFIG, kind="fmp4", viewer=v, close=lambda r: None, server_spectators=2)
    assert e.value.scope == "session"
    one.leave()
    one.leave()  # idempotent
    with pytest.raises(SpectatorRefused, match="the server has 3 spectators") as e:
        vs.admit(CONFIG, kind="fmp4", viewer=v, close=lambda r: None, server_spectators=3)
    assert e.value.scope == "server" and e.value.retry_after_s == CONFIG.retry_after_s
    assert len(vs.spectators) == 1


def test_the_default_server_cap_is_the_cpu_budget_over_the_measured_cost_and_a_refusal_says_so() -> None:
    cost = SPECTATOR_COST_CORES["shared"]
    assert spectator_cap(2) == int(2 * SPECTATOR_CPU_SHARE / cost) and spectator_cap(16) == 8 * spectator_cap(2)
    assert spectator_cap(1, share=0.01, cost_cores=1.0) == 1, "never below one"
    for bad in ({"cores": 0}, {"cores": 2, "share": 0.0}, {"cores": 2, "cost_cores": 0.0}):
        with pytest.raises(ValueError, match="spectator_cap"):
            spectator_cap(**bad)  # type: ignore[arg-type]
    config = ViewerConfig(cpu_cores=2)
    cap = config.server_cap
    assert cap == spectator_cap(2) and ViewerConfig(max_spectators=5, cpu_cores=2).server_cap == 5
    vs = Viewers("sid", clock=FakeClock())
    vs.admit(config, kind="fmp4", viewer=None, close=lambda r: None, server_spectators=cap - 1)
    with pytest.raises(SpectatorRefused) as e:
        vs.admit(config, kind="fmp4", viewer=None, close=lambda r: None, server_spectators=cap)
    assert e.value.scope == "server"
    assert str(e.value) == (f"the server has {cap} spectators, the most it takes ({cap}: 25% of 2 cores at "
                            f"{cost:g} cores a spectator, measured; one with an encode of its own counts "
                            f"{own_encode_weight()})")
    with pytest.raises(SpectatorRefused, match=r"the most it takes \(5: as configured \(--max-spectators\)\)"):
        vs.admit(ViewerConfig(max_spectators=5), kind="fmp4", viewer=None, close=lambda r: None, server_spectators=5)


def test_a_spectator_with_an_encode_of_its_own_counts_for_what_it_costs(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    weight = own_encode_weight()
    assert weight == -(-SPECTATOR_COST_CORES["own_encode"] // SPECTATOR_COST_CORES["shared"]) and weight > 1
    config = ViewerConfig(max_spectators=weight + 1)
    shared = s.viewers.admit(config, kind="fmp4", viewer=None, close=lambda r: None, server_spectators=0)
    own = s.viewers.admit(config, kind="whep", viewer=None, close=lambda r: None, server_spectators=1)
    own.weight = weight  # the WHEP peer's answer chose VP8 (transport/webrtc/whep.py)
    assert count_spectators([s]) == weight + 1
    with pytest.raises(SpectatorRefused, match=f"the server has {weight + 1} spectators"):
        s.viewers.admit(config, kind="fmp4", viewer=None, close=lambda r: None, server_spectators=count_spectators([s]))
    own.leave()
    assert count_spectators([s]) == 1
    shared.leave()


def test_revoking_closes_only_that_viewers_spectators() -> None:
    vs = Viewers("sid", clock=FakeClock())
    a, b = vs.issue(CONFIG), vs.issue(CONFIG)
    closed: list[str] = []
    vs.admit(CONFIG, kind="whep", viewer=a, close=lambda r: closed.append("a:" + r), server_spectators=0)
    vs.admit(CONFIG, kind="fmp4", viewer=b, close=lambda r: closed.append("b:" + r), server_spectators=1)
    vs.revoke(a.viewer_id)
    assert closed == ["a:revoked"] and len(vs.spectators) == 1
    with pytest.raises(SpectatorRefused, match="revoked"):  # a stream racing its revocation is refused
        vs.admit(CONFIG, kind="fmp4", viewer=a, close=lambda r: None, server_spectators=1)


def test_authorize_tells_controller_viewer_and_nothing_apart(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    other = make(model)
    other.id, other.token = "other", "tok-other"
    sessions = {"sid": s, "other": other}
    v = s.viewers.issue(CONFIG)
    assert authorize(sessions, "sid", "tok").controller  # type: ignore[union-attr]
    access = authorize(sessions, "sid", v.token)
    assert access is not None and not access.controller and access.viewer is v and access.session is s
    assert authorize(sessions, "other", v.token) is None  # a viewer token opens only its own session
    assert authorize(sessions, "other", "tok") is None
    assert authorize(sessions, "nope", "tok") is None
    assert token_opens_any(sessions, v.token) and not token_opens_any(sessions, "x")
    s.viewers.revoke(v.viewer_id)
    assert authorize(sessions, "sid", v.token) is None
    s.close(CloseReason.CLIENT)
    assert authorize(sessions, "sid", "tok") is None


def test_spectator_sinks_neither_wake_nor_hold_the_session(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    spectator, viewer = ListSink(), ListSink()
    s.attach_spectator(spectator)
    assert s.state == SessionState.CREATED and s.viewer_count == 0 and s.sink_count == 0
    s.attach_sink(viewer)
    assert s.state == SessionState.ACTIVE and s.viewer_count == 1
    s.frames.deliver(frame(0, 0))
    assert len(spectator.frames) == len(viewer.frames) == 1  # the same frames, the same pipeline
    s.detach_sink(viewer)  # the last viewer left: idle, whatever spectators remain
    assert s.state == SessionState.IDLE and s.viewer_count == 0 and s.frames.sinks == [spectator]
    s.detach_sink(spectator)
    assert s.frames.sinks == []


def test_closing_the_session_revokes_its_viewers_and_closes_its_spectators(model) -> None:  # type: ignore[no-untyped-def]
    s = make(model)
    v = s.viewers.issue(CONFIG)
    closed: list[str] = []
    s.viewers.admit(CONFIG, kind="fmp4", viewer=v, close=closed.append, server_spectators=0)
    s.viewers.admit(CONFIG, kind="whep", viewer=None, close=closed.append, server_spectators=1)
    assert count_spectators([s]) == 2
    s.close(CloseReason.CLIENT)
    assert closed == ["session_closed", "session_closed"] and count_spectators([s]) == 0 and not s.viewers.tokens
    with pytest.raises(ViewerRefused, match="closed"):
        s.viewers.issue(CONFIG)
    with pytest.raises(SessionClosedError):
        s.attach_spectator(ListSink())
