"""An action's rules end to end on the path a real one takes: the server's `ActionGate` decides, the engine's
`SessionConditioner` keeps the result (held keys, summed movement) and a chunk samples it."""

import numpy as np
import pytest
import torch

from worldcast.engine.conditioner import ConditionerState, SessionConditioner
from worldcast.sessions.actions import SEQ_REORDER_WINDOW, ActionGate, SeqOutcome
from worldcast.sessions.errors import InvalidAction


class Path:
    """The gate's deltas into a session's conditioner, as `SessionInputs` and the engine contract carry them."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self.model = model
        self.gate = ActionGate(model.spec.actions.keys)
        context = {name: torch.zeros(shape, dtype=dt).numpy() for name, shape, dt in model.spec.conditioning.tensors}
        self.cond = SessionConditioner(model, ConditionerState(epoch=0, wants_frames=True, context_version=0,
                                                               context=context))

    def push(self, seq: int, keys: list[str], mouse: tuple[float, float]) -> SeqOutcome:
        outcome, delta = self.gate.push(seq, keys, mouse, now_s=0.0)
        self.cond.push(delta)
        return outcome

    def release_all(self) -> None:
        self.cond.push(self.gate.release_all())

    @property
    def held(self) -> set[str]:
        return set(self.cond.conditioner_state().held)

    @property
    def mouse(self) -> tuple[float, float]:
        return self.cond.conditioner_state().mouse


def test_newest_seq_wins_for_keys_and_mouse_accumulates(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    assert p.push(1, ["w"], (3, 0)) is SeqOutcome.NEWEST
    assert p.push(0, ["s"], (2, 1)) is SeqOutcome.STALE  # late arrival: keys ignored, movement kept
    assert p.held == {"w"} and p.mouse == (5.0, 1.0) and p.cond.conditioner_state().seq == 1
    ci = p.cond.sample_chunk(1)
    assert ci.action_seq == 1
    assert np.array_equal(ci.actions[0], model.encode_action({k: k == "w" for k in p.gate.key_names}, (5.0, 1.0)))
    assert p.mouse == (0.0, 0.0), "a chunk consumes the movement"
    assert p.held == {"w"}, "held keys persist"


def test_mouse_is_split_across_the_chunks_frames(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(0, [], (8, -4))
    actions = p.cond.sample_chunk(4).actions
    want = model.encode_action({k: False for k in p.gate.key_names}, (2.0, -1.0))
    assert actions.shape[0] == 4 and all(np.array_equal(a, want) for a in actions)


@pytest.mark.parametrize(
    "seq,keys,mouse,match",
    [(0, ["jump"], (0, 0), "unknown key"), (-1, [], (0, 0), "seq"), (0, [], (1e9, 0), "mouse")],
)
def test_bad_messages_are_rejected_and_change_nothing(model, seq, keys, mouse, match) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(5, ["d"], (1, 1))
    with pytest.raises(InvalidAction, match=match):
        p.push(seq, keys, mouse)
    assert p.gate.last_seq == 5 and p.held == {"d"} and p.mouse == (1.0, 1.0)


def test_release_all(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(0, ["w", "shift"], (5, 5))
    p.release_all()
    assert p.held == set() and p.mouse == (0.0, 0.0)


def test_one_wild_seq_far_ahead_cannot_freeze_the_keys(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(0, ["w"], (0, 0))
    assert p.push(2**53, ["space"], (0, 0)) is SeqOutcome.NEWEST
    assert p.push(1, ["d"], (0, 0)) is SeqOutcome.RESTART  # the client's next message takes over
    assert p.held == {"d"} and p.gate.last_seq == 1
    assert p.push(2, [], (0, 0)) is SeqOutcome.NEWEST
    assert p.held == set()


def test_a_wild_seq_just_ahead_holds_the_keys_for_at_most_the_reorder_window(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(10, ["w"], (0, 0))
    p.push(10 + SEQ_REORDER_WINDOW, ["space"], (0, 0))
    outcomes = [p.push(10 + i, ["d"], (0, 0)) for i in range(1, SEQ_REORDER_WINDOW + 2)]
    assert outcomes.count(SeqOutcome.STALE) == SEQ_REORDER_WINDOW
    assert outcomes[-1] is SeqOutcome.NEWEST and p.held == {"d"}


def test_a_reset_counter_is_a_restart_and_a_reordered_message_is_stale(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    for q in range(100):
        p.push(q, ["w"], (0, 0))
    assert p.push(99 - SEQ_REORDER_WINDOW, ["s"], (0, 0)) is SeqOutcome.STALE
    assert p.push(0, ["a"], (0, 0)) is SeqOutcome.RESTART  # the client started counting again
    assert p.held == {"a"} and p.gate.last_seq == 0
