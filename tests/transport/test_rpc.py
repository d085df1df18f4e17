"""The shared RPC and action parser (transport/rpc.py) on a real session: JSON-RPC 2.0 framing, ids on every
error, notifications, seq feedback; no network."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fakes import EngineSide, FakeClock
from worldcast.engine.rollout import ChunkRollout
from worldcast.engine.state_pool import StatePool
from worldcast.models.spec import ConditioningRequest
from worldcast.sessions.session import CloseReason, Session, SessionState
from worldcast.transport import errors
from worldcast.transport.limits import InputGuard, InputLimits
from worldcast.transport.rpc import ActionHandler, RpcHandler


@pytest.fixture
def session(model) -> Session:  # type: ignore[no-untyped-def]
    return Session("sid", "tok", model=model, conditioning=ConditioningRequest(text="a green meadow"),
                   context={"prompt": np.zeros(384, np.float32)},
                   seed=0, clock=FakeClock())


@pytest.fixture
def rpc(session: Session, model) -> RpcHandler:  # type: ignore[no-untyped-def]
    return RpcHandler(session)


async def test_jsonrpc_2_framing_is_accepted_and_echoed(rpc: RpcHandler) -> None:
    r = await rpc.handle({"jsonrpc": "2.0", "id": "a", "method": "flush"})
    assert r == {"jsonrpc": "2.0", "id": "a", "result": {"epoch": 1}}
    assert list(r) == ["jsonrpc", "id", "result"]
    err = await rpc.handle({"jsonrpc": "2.0", "id": 2, "method": "warp"})
    assert err["jsonrpc"] == "2.0" and err["id"] == 2 and err["error"]["code"] == errors.METHOD_NOT_FOUND
    assert await rpc.handle({"id": 3, "method": "get_state"}) == {"id": 3, "result": rpc.session.info()}  # plain


@pytest.mark.parametrize("version", ["1.0", "2", 2.0, None, ["2.0"]])
async def test_any_other_jsonrpc_value_is_refused_precisely(rpc: RpcHandler, version) -> None:  # type: ignore[no-untyped-def]
    r = await rpc.handle({"jsonrpc": version, "id": 5, "method": "flush"})
    if version is None:  # an explicit null is the same as leaving it out
        assert r == {"id": 5, "result": {"epoch": 1}}
        return
    assert r["id"] == 5 and r["error"]["code"] == errors.INVALID_REQUEST and "jsonrpc" in r["error"]["message"]
    assert rpc.session.inputs.current_epoch() == 0  # nothing ran


async def test_a_notification_runs_and_gets_no_reply(rpc: RpcHandler) -> None:
    assert await rpc.handle({"jsonrpc": "2.0", "method": "flush"}) is None
    assert rpc.session.inputs.current_epoch() == 1
    assert await rpc.handle({"jsonrpc": "2.0", "method": "warp"}) is None  # errors of notifications too
    assert (await rpc.handle({"method": "flush"}))["id"] is None  # without 2.0 framing: answered, id null


@pytest.mark.parametrize("raw, rid, code, needle", [
    ('{"id": 41, "method": "flush", ', 41, errors.PARSE_ERROR, "not valid JSON"),
    ('{"jsonrpc": "2.0", "id": "q", "method": }', "q", errors.PARSE_ERROR, "not valid JSON"),
    ('{"id": 42, "method": "set_prompt", "params": {"prompt": "' + "x" * 5000 + '"}}', 42, errors.INVALID_REQUEST,
     "exceeds 4096"),
    ('[{"id": 1, "method": "flush"}]', None, errors.INVALID_REQUEST, "batch"),
    ('{"id": [1], "method": "flush"}', None, errors.INVALID_REQUEST, "id: must be"),
    ('{"id": true, "method": "flush"}', None, errors.INVALID_REQUEST, "id: must be"),
    ('{"id": "' + "k" * 65 + '", "method": "flush"}', None, errors.INVALID_REQUEST, "id: must be"),
    ('{"id": 43, "method": "flush", "params": [1]}', 43, errors.INVALID_REQUEST, "params"),
])
async def test_every_error_carries_the_id_when_it_can_be_recovered(rpc: RpcHandler, raw, rid, code,  # type: ignore[no-untyped-def]
                                                                    needle) -> None:
    r = await rpc.handle_raw(raw)
    assert r["id"] == rid and r["error"]["code"] == code and needle in r["error"]["message"], r
    assert rpc.session.inputs.current_epoch() == 0


async def test_a_500_emoji_prompt_fits_as_utf8(rpc: RpcHandler) -> None:
    prompt = "\U0001f30b" * 500
    text = json.dumps({"id": 1, "method": "set_prompt", "params": {"prompt": prompt}}, ensure_ascii=False)
    assert len(text.encode()) < 4096 < len(json.dumps({"params": {"prompt": prompt}}))  # escaped it would not fit
    assert (await rpc.handle_raw(text)) == {"id": 1, "result": {"prompt": prompt}}


def test_actions_report_stale_seqs_and_one_wild_seq_does_not_freeze(session: Session) -> None:
    engine = EngineSide(session)
    h = ActionHandler(session.inputs, guard=InputGuard(InputLimits(report_interval_s=1.0)))

    def send(seq: int, keys: list[str], t: float) -> list:  # type: ignore[type-arg]
        return h.receive(json.dumps({"seq": seq, "t": 0, "keys": keys}), t)

    assert send(5, ["w"], 0.0) == []
    (ev,) = send(3, ["s"], 0.0)
    assert ev["event"] == "action_ignored" and ev["seq"] == 3 and ev["count"] == 1
    assert "not newer than 5" in ev["message"]
    assert send(2**53, ["space"], 0.1) == []
    assert send(6, ["d"], 0.2) == []  # the client's next message is applied: nothing frozen
    assert session.inputs.actions.last_seq == 6 and engine.cond.sample_chunk(1).actions[0, 3] == 1  # d held
    assert send(4, [], 0.3) == []  # stale again: coalesced into the next summary
    (summary,) = h.guard.drain(1.0)
    assert summary["event"] == "action_ignored" and summary["count"] == 1 and summary["seq"] == 4
    assert (h.accepted, h.ignored, h.rejected) == (3, 2, 0)


def test_actions_are_refused_by_size_and_rate_before_parsing(session: Session) -> None:
    h = ActionHandler(session.inputs, guard=InputGuard(InputLimits(action_rate_hz=1, action_burst=2)))
    (big,) = h.receive("{" * 5000, 0.0)  # would be a parse error, but the size is checked first
    assert big["code"] == errors.INVALID_REQUEST and "exceeds 2048" in big["message"]
    assert h.receive('{"seq": 0, "t": 0}', 0.0) == [] and h.receive('{"seq": 1, "t": 0}', 0.0) == []
    assert h.receive("not json at all", 0.0) == []  # rate-limited before parsing; coalesced
    (summary,) = h.guard.drain(0.5)
    assert summary["counts"] == {"-32001": 1}


def test_an_action_passes_the_session_side_once_handler_inputs_chunk(session: Session, model) -> None:  # type: ignore[no-untyped-def]
    """One pass: the handler pushes into `session.inputs`, which tell the session (ACTIVE) and then send the
    engine its wants and the action; the engine's rollout samples its next chunk from the session's conditioner
    there. A push to a closed session is refused and sends the engine nothing."""
    engine = EngineSide(session)
    pool = StatePool(model.spec.states, budget_bytes=model.spec.state_bytes_per_session())
    r = ChunkRollout("sid", model, pool, engine.cond, seed=0)  # the real rollout over the engine's conditioner
    r.init(0.0)
    h = ActionHandler(session.inputs)
    seen: list[tuple[str, object]] = []
    session.on("state", lambda s, st: seen.append(("state", st)))
    assert session.state == SessionState.CREATED and not engine.cond.wants_frames()
    assert h.receive(json.dumps({"seq": 4, "t": 0, "keys": ["d"], "mouse": [8, 0]}), 0.0, coalesce=False) == []
    assert seen == [("state", SessionState.ACTIVE)]
    assert [type(m).__name__ for m in engine.log] == ["ConditionerState", "InputDelta"], "wants first, then the action"
    assert engine.cond.wants_frames() and engine.cond.input_version() == 1
    r.begin_chunk(0.0, 0.05)
    assert r.staged is not None
    got = r.staged.inputs
    assert got.action_seq == 4 and got.input_version == 1 and got.epoch == 0
    assert got.actions.shape[0] == model.spec.chunk_pixel_frames(1) and (got.actions[:, 3] == 1).all()  # d held
    assert engine.cond.conditioner_state().moves == (), "the chunk consumed the movement"
    r.abort_chunk()

    session.close(CloseReason.CLIENT)
    before, sent = engine.cond.conditioner_state(), len(engine.log)
    (ev,) = h.receive(json.dumps({"seq": 5, "t": 0, "keys": ["w"], "mouse": [3, 0]}), 0.1, coalesce=False)
    assert ev["event"] == "action_rejected" and "closed" in ev["message"]
    assert engine.cond.conditioner_state() == before and len(engine.log) == sent and not session.inputs.wants_frames()


def test_axes_on_the_wire_follow_the_declaration_and_keyboard_messages_stay_as_they_were(session: Session) -> None:
    """An action's `axes` reach the engine as the model declares them (absolute: positions, relative: movement
    added to the mouse's); a message without `axes` is read as before (every absolute axis at rest); a bad axis
    is refused with its name and leaves the engine's inputs as they were."""
    engine = EngineSide(session)
    h = ActionHandler(session.inputs)
    assert h.receive(json.dumps({"seq": 0, "t": 0, "keys": ["w"], "mouse": [4, 0],
                                 "axes": {"move_x": 0.75, "pan_x": 8}}), 0.0, coalesce=False) == []
    st = engine.cond.conditioner_state()
    assert dict(st.positions)["move_x"] == 0.75 and dict(st.moves) == {"pan_x": 12.0} and st.held == ("w",)
    assert h.receive(json.dumps({"seq": 1, "t": 0, "keys": [], "mouse": [0, 2]}), 0.0, coalesce=False) == []
    st = engine.cond.conditioner_state()
    assert set(dict(st.positions).values()) == {0.0} and dict(st.moves) == {"pan_x": 12.0, "pan_y": 2.0}
    before, sent = engine.cond.conditioner_state(), len(engine.log)
    for bad, said in [({"move_x": 2}, "within [-1, 1]"), ({"warp": 1}, "unknown axis 'warp'"),
                      ({"move_x": "1"}, "axes"), ({"": 1}, "axes"), ({f"a{i}": 0 for i in range(33)}, "axes")]:
        (ev,) = h.receive(json.dumps({"seq": 2, "t": 0, "axes": bad}), 0.0, coalesce=False)
        assert ev["event"] == "action_rejected" and said in ev["message"], (bad, ev)
    assert engine.cond.conditioner_state() == before and len(engine.log) == sent


def test_deep_nesting_is_refused_whatever_the_callers_stack_depth() -> None:
    """json.loads' own guard is the recursion limit, so whether 1,000 levels parse depended on how deep the
    caller's stack was; the explicit depth check refuses them (and anything past MAX_DEPTH) from anywhere."""
    import sys

    from worldcast.transport.errors import RpcError
    from worldcast.transport.rpc import MAX_DEPTH, parse_json

    def refused(raw: str) -> RpcError:
        try:
            parse_json(raw, what="action", max_bytes=10**6)  # the size limit is not what is tested here
        except RpcError as e:
            return e
        raise AssertionError(f"{raw[:20]!r} was accepted")

    for depth in (MAX_DEPTH + 1, 1000, max(sys.getrecursionlimit() - 50, 100)):
        e = refused("[" * depth + "]" * depth)
        assert e.code == errors.PARSE_ERROR and "nested too deeply" in str(e)
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_json(ok, what="action") is not None
    # brackets inside strings do not count
    assert parse_json('{"prompt": "' + "[" * 500 + '"}', what="control") == {"prompt": "[" * 500}
