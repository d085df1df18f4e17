"""An action's rules end to end on the path a real one takes: the server's `ActionGate` decides, the engine's
`SessionConditioner` keeps the result (held keys, axis positions, summed movement) and a chunk samples it, as the
model declares its buttons and axes (`ActionSpace`)."""

import math

import numpy as np
import pytest
import torch

from tests.fake_models import PaletteWorld
from worldcast.engine.conditioner import ConditionerState, SessionConditioner
from worldcast.models.spec import ActionSpace, Axis
from worldcast.models.tinyworld import world
from worldcast.sessions.actions import SEQ_REORDER_WINDOW, ActionGate, SeqOutcome
from worldcast.sessions.errors import InvalidAction


class Path:
    """The gate's deltas into a session's conditioner, as `SessionInputs` and the engine contract carry them."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self.model = model
        self.gate = ActionGate(model.spec.actions)
        context = {name: torch.zeros(shape, dtype=dt).numpy() for name, shape, dt in model.spec.conditioning.tensors}
        self.cond = SessionConditioner(model, ConditionerState(epoch=0, wants_frames=True, context_version=0,
                                                               context=context))

    def push(self, seq: int, keys: list[str], mouse: tuple[float, float] = (0, 0),
             axes: dict[str, float] | None = None) -> SeqOutcome:
        outcome, delta = self.gate.push(seq, keys, mouse, now_s=0.0, axes=axes)
        self.cond.push(delta)
        return outcome

    def release_all(self) -> None:
        self.cond.push(self.gate.release_all())

    @property
    def held(self) -> set[str]:
        return set(self.cond.conditioner_state().held)

    @property
    def moves(self) -> dict[str, float]:
        return dict(self.cond.conditioner_state().moves)

    @property
    def positions(self) -> dict[str, float]:
        return dict(self.cond.conditioner_state().positions)

    @property
    def mouse(self) -> tuple[float, float]:
        """Pending movement of the axes the wire's mouse feeds."""
        return tuple(self.moves.get(a.name, 0.0) if a else 0.0 for a in self.model.spec.actions.mouse)  # type: ignore[return-value]

    def vector(self, held: set[str], moves: dict[str, float] | None = None, positions: dict[str, float] | None = None,
               frames: int = 1) -> np.ndarray:
        """What the model encodes for one pixel frame of a chunk of `frames` with these inputs."""
        space = self.model.spec.actions
        return self.model.encode_action({k: k in held for k in space.keys},
                                        space.axis_values(moves or {}, positions or {}, frames))


def test_newest_seq_wins_for_keys_and_mouse_accumulates(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    assert p.push(1, ["w"], (3, 0)) is SeqOutcome.NEWEST
    assert p.push(0, ["s"], (2, 1)) is SeqOutcome.STALE  # late arrival: keys ignored, movement kept
    assert p.held == {"w"} and p.mouse == (5.0, 1.0) and p.cond.conditioner_state().seq == 1
    ci = p.cond.sample_chunk(1)
    assert ci.action_seq == 1
    assert np.array_equal(ci.actions[0], p.vector({"w"}, {"pan_x": 5.0, "pan_y": 1.0}))
    assert p.mouse == (0.0, 0.0), "a chunk consumes the movement"
    assert p.held == {"w"}, "held keys persist"


def test_mouse_is_split_across_the_chunks_frames(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(0, [], (8, -4))
    actions = p.cond.sample_chunk(4).actions
    want = p.vector(set(), {"pan_x": 8.0, "pan_y": -4.0}, frames=4)
    assert actions.shape[0] == 4 and all(np.array_equal(a, want) for a in actions)
    assert np.array_equal(want, world.action_vector({}, (2.0, -1.0))), "the counts of each frame, as before axes"


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


# -- axes as the model declares them -------------------------------------------------------------------------------


def test_absolute_axes_are_state_newest_wins_and_left_out_is_at_rest(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(1, [], axes={"move_x": 0.8, "look_y": -0.5})
    assert p.push(0, [], axes={"move_x": -1.0}) is SeqOutcome.STALE  # reordered: position ignored
    assert p.positions["move_x"] == 0.8 and p.positions["look_y"] == -0.5 and p.positions["move_y"] == 0.0
    p.push(2, ["w"], axes={"look_y": -0.5})  # move_x left out: back at rest
    assert p.positions["move_x"] == 0.0 and p.held == {"w"}
    first = p.cond.sample_chunk(3).actions
    second = p.cond.sample_chunk(3).actions
    assert np.array_equal(first, second), "a position holds on every chunk (movement would be consumed)"
    p.release_all()
    assert set(p.positions.values()) == {0.0} and p.held == set()


def test_relative_axes_from_the_wire_mouse_and_from_axes_add_up(model) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(0, [], (4, 0), axes={"pan_x": 8})
    p.push(1, [], (0, 2), axes={"pan_y": 2})
    assert p.moves == {"pan_x": 12.0, "pan_y": 4.0}
    assert np.array_equal(p.cond.sample_chunk(1).actions[0], world.action_vector({}, (12.0, 4.0)))


def test_tinyworld_gamepad_drives_what_keys_and_mouse_drive(model) -> None:  # type: ignore[no-untyped-def]
    """The left stick past the press point holds a direction's key, the trigger holds shift, the right stick at full
    pans as far as the mouse can in a frame: vectors the network was trained on."""
    p = Path(model)
    p.push(0, [], axes={"move_x": 0.9, "move_y": -0.3, "run": 1.0, "look_x": -1.0})
    full_pan = world.MAX_PAN_PX * world.MOUSE_COUNTS_PER_PX  # counts of the mouse's largest pan in a frame
    assert np.array_equal(p.cond.sample_chunk(2).actions[0], world.action_vector({"d": True, "shift": True},
                                                                               (-full_pan, 0.0)))
    p.push(1, [], axes={"move_y": 0.6, "look_y": 0.5})
    assert np.array_equal(p.cond.sample_chunk(2).actions[0],
                          world.action_vector({"s": True}, (0.0, world.MAX_PAN_PX / 2 * world.MOUSE_COUNTS_PER_PX)))


@pytest.mark.parametrize("axes,match", [({"warp": 1.0}, "unknown axis 'warp'"), ({"move_x": 1.5}, r"within \[-1, 1\]"),
                                        ({"run": -0.1}, r"within \[0, 1\]"), ({"look_x": math.nan}, "move_x|look_x"),
                                        ({"pan_x": math.inf}, "pan_x")])
def test_bad_axes_are_refused_and_change_nothing(model, axes, match) -> None:  # type: ignore[no-untyped-def]
    p = Path(model)
    p.push(5, ["d"], (4, 0), axes={"move_y": 0.25})
    before = p.cond.conditioner_state()
    with pytest.raises(InvalidAction, match=match):
        p.push(6, ["w"], axes=axes)
    assert p.cond.conditioner_state() == before and p.gate.last_seq == 5


def test_a_camera_pose_axis_reaches_the_model_in_its_units() -> None:
    """A model-declared absolute axis (the fake palette world's "roll", degrees on the wire, radians to the model)
    needs nothing outside its model: the gate checks its range, the conditioner holds it, the vector carries it."""
    p = Path(PaletteWorld())
    p.push(0, ["e"], (30, 0), axes={"roll": 45})
    a = p.cond.sample_chunk(3).actions
    assert a.shape == (3, 4) and (a[:, 1] == 1).all()
    assert np.allclose(a[:, 2], 0.1) and np.allclose(a[:, 3], math.pi / 4), "yaw 30 counts x 0.01 over 3 frames; roll"
    with pytest.raises(InvalidAction, match=r"within \[-90, 90\]"):
        p.push(1, [], axes={"roll": 91})


def test_a_declaration_that_cannot_be_driven_is_refused() -> None:
    with pytest.raises(ValueError, match="relative axis"):
        ActionSpace(keys=("w",), axes=(Axis("tilt", kind="absolute", range=(-1, 1)),), bindings=(("mouse.x", "tilt"),))
    with pytest.raises(ValueError, match="absolute axis"):
        ActionSpace(keys=("w",), axes=(Axis("yaw"),), bindings=(("gamepad.axis.0", "yaw"),))
    with pytest.raises(ValueError, match="unknown device input"):
        ActionSpace(keys=("w",), bindings=(("joystick.7", "w"),))
    with pytest.raises(ValueError, match="unknown control"):
        ActionSpace(keys=("w",), bindings=(("gamepad.button.0", "jump"),))
    with pytest.raises(ValueError, match="rest"):
        Axis("trigger", kind="absolute", range=(0, 1), rest=-1)
