"""The spectators benchmark's server caps admit every phase it opens (a VP8-only player counts its weight)."""

from __future__ import annotations

import pytest

from tests.fakes import FakeClock
from worldcast.latency_bench.spectators import cap_flags
from worldcast.sessions.errors import SpectatorRefused
from worldcast.sessions.viewers import ViewerConfig, Viewers, own_encode_weight


def _config(flags: list[str]) -> ViewerConfig:
    opts = dict(zip(flags[::2], flags[1::2], strict=True))
    return ViewerConfig(max_spectators_per_session=int(opts["--max-spectators-per-session"]),
                        max_spectators=int(opts["--max-spectators"]))


@pytest.mark.parametrize(("kinds", "weight"), [(["fmp4", "whep"], 1), (["whep-vp8"], own_encode_weight())])
def test_the_largest_phase_is_admitted_and_one_more_is_refused(kinds: list[str], weight: int) -> None:
    config = _config(cap_flags([0, 1, 4], kinds))
    vs = Viewers("sid", clock=FakeClock())
    for i in range(4):  # each spectator as the server counts it: its weight once its answer chose the codec
        sp = vs.admit(config, kind="whep", viewer=None, close=lambda r: None, server_spectators=i * weight)
        sp.weight = weight
    with pytest.raises(SpectatorRefused):
        vs.admit(config, kind="whep", viewer=None, close=lambda r: None, server_spectators=4 * weight)


def test_a_run_without_spectators_still_starts_a_server_that_takes_one() -> None:
    assert _config(cap_flags([0], ["fmp4"])).server_cap == 1
