"""The Python clients refuse, before sending, actions the served model would reject."""

from __future__ import annotations

import pytest

from worldcast.transport.clients.errors import UnknownKey
from worldcast.transport.clients.session_api import action_cycle, check_keys, check_mouse

MODEL = {"name": "m", "actions": {"keys": ["q", "e"]}, "keys": ["q", "e"]}


def test_keys_are_checked_against_the_declared_action_space() -> None:
    check_keys(MODEL, ["q", "e"])
    with pytest.raises(UnknownKey, match="'w' is not in m's action space"):
        check_keys(MODEL, ["q", "w"])
    for bad in ("qe", b"q", ["q", 3]):
        with pytest.raises(TypeError, match="list of key names"):
            check_keys(MODEL, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [(float("nan"), 0), (0, float("inf")), (1, 2, 3), (True, 0), ("1", 0)])
def test_mouse_must_be_two_finite_numbers(bad: tuple) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match="two finite numbers"):
        check_mouse(bad)  # type: ignore[arg-type]


def test_benchmarks_cycle_through_the_model_s_own_keys() -> None:
    assert action_cycle(MODEL) == [["q"], ["e"]]
    assert action_cycle({"keys": []}) == [[]]
