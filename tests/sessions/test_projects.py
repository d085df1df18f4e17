"""Directing projects (no session): the rule-based rewrite, rollouts, the cap, loop and auto-extension."""

from __future__ import annotations

import pytest

from worldcast.sessions.projects import MAX_SEEDS, REWRITE_SEGMENTS, Project, ProjectStart, rewrite_window


def test_a_rewrite_writes_the_instruction_into_every_prompt_of_the_window() -> None:
    w = ["a harbor at night", "boats leave", "the market opens"]
    assert rewrite_window("it starts to rain", w) == ["it starts to rain"] * REWRITE_SEGMENTS  # padded to 6
    # the client's padded window ([new, old, old, old, old, new] before issue 31): every prompt is the edit
    padded = ["a fox", "fill", "fill", "fill", "fill", "fill", "fill", "fill"]
    assert rewrite_window("the fox runs", padded) == ["the fox runs"] * len(padded)
    assert rewrite_window(None, w) == w  # no instruction: the window again, from its first
    assert rewrite_window("a fox", []) == ["a fox"] * REWRITE_SEGMENTS  # a custom start's seeds
    assert rewrite_window("x", [f"p{i}" for i in range(100)]) == ["x"] * MAX_SEEDS


def test_rollouts_cap_loop_and_auto_extension() -> None:
    p = Project(cap=2)
    assert p.next_kind() == "idle"
    p.begin(ProjectStart(["a", "b", "c"], None))
    assert p.rollout == 1 and p.next_kind() == "seed" and p.take_seed() == ("a", 0)
    p.started = 2
    assert p.at_cap and p.next_kind() == "capped"
    p.new_rollout()
    assert (p.rollout, p.next_seed, p.started, p.capped) == (2, 0, 0, False)
    q = Project(cap=0)
    q.begin(ProjectStart(["a"], None, loop=True))
    q.take_seed()
    assert q.next_kind() == "loop"
    q.loop, q.auto_extension, q.last_prompt = False, True, "a"
    assert q.next_kind() == "auto"
    q.auto_extension = False
    assert q.next_kind() == "blocked"
    q.end()
    assert q.next_kind() == "idle" and not q.seeds
    with pytest.raises(ValueError):
        Project(cap=-1)
