"""The long-session policy of the Self-Forcing / CausVid presets, measured (long_session.py): past the trained
21-frame horizon a rolled chunk is given exactly the horizon's last chunk's inputs; sinks would not be."""

from __future__ import annotations

from tests.models.causal_wan.long_session import measure


def test_a_rolled_window_presents_the_trained_geometry_and_sinks_do_not() -> None:
    m = measure(shifts=(21, 99_999))
    for d in (21, 99_999):
        assert m[f"rolled by {d} frames"] <= 1e-12, m  # float64: RoPE is relative in time
        assert m[f"with 3 sinks, rolled by {d} frames"] > 1e-4, m  # sinks sit further back than in training
