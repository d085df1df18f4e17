import pytest

from worldcast.sessions.actions import SEQ_REORDER_WINDOW, ActionBuffer, SeqOutcome
from worldcast.sessions.errors import InvalidAction

KEYS = ("w", "a", "s", "d", "space", "shift")


def test_newest_seq_wins_for_keys_and_mouse_accumulates() -> None:
    b = ActionBuffer(KEYS)
    assert b.push(1, ["w"], (3, 0), now_s=0) is SeqOutcome.NEWEST
    assert b.push(0, ["s"], (2, 1), now_s=0) is SeqOutcome.STALE  # late arrival: keys ignored, movement kept
    s = b.sample(1)
    assert s.keys[0]["w"] and not s.keys[0]["s"] and s.seq == 1
    assert s.mouse == [(5.0, 1.0)]
    assert b.sample(1).mouse == [(0.0, 0.0)]  # consumed
    assert b.sample(1).keys[0]["w"]  # held keys persist


def test_mouse_is_split_across_the_chunks_frames() -> None:
    b = ActionBuffer(KEYS)
    b.push(0, [], (8, -4), now_s=0)
    assert b.sample(4).mouse == [(2.0, -1.0)] * 4


@pytest.mark.parametrize(
    "seq,keys,mouse,match",
    [(0, ["jump"], (0, 0), "unknown key"), (-1, [], (0, 0), "seq"), (0, [], (1e9, 0), "mouse")],
)
def test_bad_messages_are_rejected_and_change_nothing(seq, keys, mouse, match) -> None:  # type: ignore[no-untyped-def]
    b = ActionBuffer(KEYS)
    b.push(5, ["d"], (1, 1), now_s=0)
    with pytest.raises(InvalidAction, match=match):
        b.push(seq if seq >= 0 else seq, keys, mouse, now_s=1)
    s = b.sample(1)
    assert s.seq == 5 and s.keys[0]["d"] and s.mouse == [(1.0, 1.0)]


def test_release_all() -> None:
    b = ActionBuffer(KEYS)
    b.push(0, ["w", "shift"], (5, 5), now_s=0)
    b.release_all()
    s = b.sample(1)
    assert not any(s.keys[0].values()) and s.mouse == [(0.0, 0.0)]


def test_one_wild_seq_far_ahead_cannot_freeze_the_keys() -> None:
    b = ActionBuffer(KEYS)
    b.push(0, ["w"], (0, 0), now_s=0)
    assert b.push(2**53, ["space"], (0, 0), now_s=0) is SeqOutcome.NEWEST
    assert b.push(1, ["d"], (0, 0), now_s=0) is SeqOutcome.RESTART  # the client's next message takes over
    assert b.sample(1).keys[0]["d"] and b.last_seq == 1
    assert b.push(2, [], (0, 0), now_s=0) is SeqOutcome.NEWEST
    assert not any(b.sample(1).keys[0].values())


def test_a_wild_seq_just_ahead_holds_the_keys_for_at_most_the_reorder_window() -> None:
    b = ActionBuffer(KEYS)
    b.push(10, ["w"], (0, 0), now_s=0)
    b.push(10 + SEQ_REORDER_WINDOW, ["space"], (0, 0), now_s=0)
    outcomes = [b.push(10 + i, ["d"], (0, 0), now_s=0) for i in range(1, SEQ_REORDER_WINDOW + 2)]
    assert outcomes.count(SeqOutcome.STALE) == SEQ_REORDER_WINDOW
    assert outcomes[-1] is SeqOutcome.NEWEST and b.sample(1).keys[0]["d"]


def test_a_reset_counter_is_a_restart_and_a_reordered_message_is_stale() -> None:
    b = ActionBuffer(KEYS)
    for q in range(100):
        b.push(q, ["w"], (0, 0), now_s=0)
    assert b.push(99 - SEQ_REORDER_WINDOW, ["s"], (0, 0), now_s=0) is SeqOutcome.STALE
    assert b.push(0, ["a"], (0, 0), now_s=0) is SeqOutcome.RESTART  # the client started counting again
    assert b.sample(1).keys[0]["a"] and b.last_seq == 0
