"""`--transport fmp4`: the WebSocket probe, direction-to-first-frame and its WebRTC counterpart, on loopback."""

from __future__ import annotations

import pytest

from worldcast.latency_bench import fmp4
from worldcast.latency_bench.__main__ import main

pytestmark = pytest.mark.timeout(240)


async def test_stream_probe_measures_mtp_from_stamped_fmp4_pixels(live_server) -> None:  # type: ignore[no-untyped-def]
    (m,) = await fmp4.run_mtp(live_server.url, sessions=1, seconds=2.0, action_hz=6.0)
    assert m.mtp_source == "pixels" and m.stamps_read > 0.9, m
    assert m.mtp_ms and all(x > 0 for x in m.mtp_ms)
    assert m.actions_unanswered <= 1 and m.frames > 5 and m.ttff_ms > 0
    assert set(m.stages_ms) >= {"queue", "denoise", "decode"}


async def test_direction_to_first_frame_counts_no_old_frame_after_the_ack(live_server) -> None:  # type: ignore[no-untyped-def]
    d = await fmp4.run_directions(live_server.url, count=3, interval_s=0.4, seed=1)
    assert d["directions"] == 3 and len(d["samples_ms"]) == 3 and d["old_frames_after_ack"] == 0
    assert d["direction_to_first_frame_ms"]["p50"] >= d["ack_to_first_frame_ms"]["p50"] > 0
    w = await fmp4.run_prompt_changes(live_server.url, count=2, interval_s=0.4, seed=2)
    assert len(w["samples_ms"]) == 2 and all(x > 0 for x in w["samples_ms"])


def test_fmp4_transport_is_for_mtp_only(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["load", "--transport", "fmp4"])
    assert "--transport fmp4 applies to mtp" in capsys.readouterr().err
