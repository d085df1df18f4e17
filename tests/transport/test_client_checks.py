"""The Python clients refuse, before sending, actions the served model would reject."""

from __future__ import annotations

import pytest

from worldcast.transport.clients.errors import UnknownKey
from worldcast.transport.clients.session_api import action_cycle, action_message, check_keys, check_mouse

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


def test_axes_are_checked_against_the_declared_axes_and_left_out_when_empty() -> None:
    model = {"name": "m", "actions": {"keys": ["q"], "axes": [{"name": "roll", "range": [-90, 90]}]}}
    assert action_message(model, 3, 1.5, ["q"], (1, 0)) == {"seq": 3, "t": 1500.0, "keys": ["q"], "mouse": [1, 0]}
    assert action_message(model, 4, 2.0, [], axes={"roll": 45})["axes"] == {"roll": 45}
    with pytest.raises(UnknownKey, match="axis 'yaw' is not in m's axes"):
        action_message(model, 5, 2.0, [], axes={"yaw": 1})
    for bad in (91, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="roll"):
            action_message(model, 5, 2.0, [], axes={"roll": bad})
