"""The benchmark's measuring parts against a real server on loopback: stamped WebRTC probes, a
trace replay with a refusal, reports, and the CLI with its own server process."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import numpy as np
import pytest
from rich.console import Console

from tests.conftest import _serve, server_config
from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.latency_bench import report
from worldcast.latency_bench.load import SLO, replay
from worldcast.latency_bench.probe import SessionProbe
from worldcast.latency_bench.server import PRESETS, ServerProfile
from worldcast.latency_bench.trace import Segment, Trace, TraceSession
from worldcast.sessions.manager import SessionConfig

pytestmark = pytest.mark.timeout(240)

PERIOD_S = 0.05


async def act_and_measure(url: str, *, seed: int, stamped: bool, seconds: float):  # type: ignore[no-untyped-def]
    """Open a probe, act at 8 Hz for `seconds`, wait until the last action shows (bounded), measure, close."""
    p = await SessionProbe.open(url, seed=seed, stamped=stamped)
    try:
        await p.first_frame(30.0)
        start = time.monotonic()
        await p.act_for(seconds, 8.0)
        last = p.actions[-1][0]
        if stamped:
            shown = lambda: any(f.action_seq is not None and f.action_seq >= last for f in p.frames)  # noqa: E731
        else:
            shown = lambda: any(e["action_seq"] >= last for e in p.client.frame_events)  # noqa: E731
        deadline = time.monotonic() + 30
        while not shown():
            assert time.monotonic() < deadline, "the last action never showed"
            await asyncio.sleep(0.02)
        return p, p.measure([(start, time.monotonic())], frame_period_s=PERIOD_S)
    finally:
        await p.close()


async def test_stamped_probe_reads_frame_index_and_action_seq_from_decoded_video(live_server) -> None:  # type: ignore[no-untyped-def]
    p, m = await act_and_measure(live_server.url, seed=3, stamped=True, seconds=2.0)
    assert m.mtp_source == "pixels" and m.stamps_read > 0.95
    idx = [f.frame_index for f in p.frames if f.frame_index is not None]
    assert all(b > a for a, b in zip(idx, idx[1:]))  # read back exactly, in order
    seqs = [f.action_seq for f in p.frames if f.action_seq is not None]
    assert seqs[-1] == p.actions[-1][0]  # the last action sent shows in the last frames
    assert all(b >= a for a, b in zip(seqs, seqs[1:]))
    assert m.mtp_ms and min(m.mtp_ms) > 0 and len(m.mtp_ms) + m.actions_unanswered == len(p.actions)
    assert m.frames > 0 and m.fps > 0  # how fast is the benchmark's business, not a test's
    assert np.isfinite(m.stages_ms["event_to_decoded"]) and m.stages_ms["denoise"] > 0


async def test_unstamped_probe_falls_back_to_frame_events(live_server) -> None:  # type: ignore[no-untyped-def]
    p, m = await act_and_measure(live_server.url, seed=4, stamped=False, seconds=1.0)
    assert m.mtp_source == "frame-event" and m.stamps_read == 0.0
    assert all(f.frame_index is None for f in p.frames)
    assert m.mtp_ms and min(m.mtp_ms) > 0


def _tiny_trace() -> Trace:
    return Trace(
        format="worldcast-trace/1", name="tiny", description="two sessions, one device slot", duration_s=8.0,
        generator=None,
        sessions=[
            TraceSession(id="a", arrive_s=0.0, leave_s=7.0, seed=1, action_hz=6.0, segments=[
                Segment(start_s=0.0, end_s=3.0, state="active"), Segment(start_s=3.0, end_s=5.0, state="idle"),
                Segment(start_s=5.0, end_s=7.0, state="active")]),
            TraceSession(id="b", arrive_s=1.0, leave_s=3.5, seed=2, action_hz=6.0, segments=[
                Segment(start_s=1.0, end_s=3.5, state="active")]),
        ],
    )


def test_trace_replay_measures_active_periods_pauses_idle_ones_and_counts_refusals(model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    one_slot = server_config(sessions=SessionConfig(
        idle_after_s=60.0, admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=1)))
    gen = _serve(one_slot, model)
    srv = next(gen)
    try:
        res = asyncio.run(replay(srv.url, _tiny_trace(), profile="one-slot", slo=SLO(mtp_p95_ms=10_000)))
    finally:
        gen.close()
    a, b = res.sessions
    s = res.summary
    assert (s["arrived"], s["admitted"], s["never_admitted"]) == (2, 1, 1), [
        (o.id, o.admitted_s, o.refusals, o.error) for o in res.sessions]
    assert b.admitted_s is None and b.refusals >= 1 and b.refused_s and s["refusals_503"] == b.refusals
    assert a.error is None and a.metrics is not None and len(a.active) == 2 and a.metrics.frames > 0
    # while idle (paused) the session costs nothing: no frames beyond what sat in the sink
    (_, paused_at), (resumed_at, _) = a.active
    idle = [t for t in a.frame_times if paused_at + 0.6 < t < resumed_at]
    assert len(idle) <= 2, idle
    # whether the admitted session met its SLO depends on the machine: only the accounting is checked
    assert s["served_within_slo"] in (0, 1) and s["slo_attainment"] == s["served_within_slo"] / 2
    assert s["active_sessions_peak"] == 1

    d = res.as_dict()
    report.plot_timeline(d, tmp_path / "t.png")
    report.plot_mtp_cdf({"one-slot": a.metrics.mtp_ms}, tmp_path / "c.png")
    import matplotlib.image

    for name in ("t.png", "c.png"):
        img = matplotlib.image.imread(tmp_path / name)
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0  # a picture, not a blank
    con = Console(record=True, width=200)
    report.table("trace replay", {"one-slot": s}, console=con)
    text = con.export_text()
    assert "slo_attainment" in text and f"{s['slo_attainment']:.3f}" in text
    json.dumps(d)  # the JSON report is serialisable


def test_profiles_parse_presets_and_overrides() -> None:
    assert ServerProfile.parse("baseline").max_batch == 1
    p = ServerProfile.parse("duty-cycle:target_utilization=0.7,max-sessions=6")
    assert (p.name, p.admission, p.target_utilization, p.max_sessions) == ("duty-cycle", "duty-cycle", 0.7, 6)
    custom = ServerProfile.parse("mine:max_batch=2")
    assert custom.name == "mine" and custom.max_batch == 2 and custom.admission == PRESETS["shared"].admission
    assert "--max-batch" in custom.flags() and "2" in custom.flags()
    with pytest.raises(ValueError, match="key=value"):
        ServerProfile.parse("shared:bogus=1")
    with pytest.raises(ValueError, match="no profile preset 'statc'"):
        ServerProfile.parse("statc")  # a typo of "static" does not quietly run "shared"
    with pytest.raises(ValueError, match="bad value for max_batch"):
        ServerProfile.parse("shared:max_batch=lots")
    assert replace(p, threads=1).flags()[-2:] == ["--threads", "1"]


@pytest.mark.timeout(300)
def test_cli_mtp_starts_its_own_server_and_writes_reports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from worldcast.latency_bench.__main__ import main

    main(["mtp", "--seconds", "3", "--action-hz", "5", "--out", str(tmp_path), "--profile", "shared:threads=1"])
    rep = json.loads((tmp_path / "report.json").read_text())
    run = rep["runs"][0]
    assert run["transport"] == "webrtc" and run["summary"]["mtp_source"] == ["pixels"]
    assert run["summary"]["actions"] >= 1 and run["summary"]["mtp_ms"]["p50"] > 0
    assert (tmp_path / "mtp_cdf.png").stat().st_size > 1000


@pytest.mark.timeout(300)
def test_cli_startup_times_each_server_to_ready_with_its_warmup_phases(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from worldcast.latency_bench.__main__ import main

    main(["startup", "--runs", "1", "--out", str(tmp_path), "--profile", "shared:threads=1"])
    rep = json.loads((tmp_path / "report.json").read_text())
    (run,) = rep["runs"]
    assert set(run["phases_s"]) >= {"threads", "precision", "costs", "total"}
    assert 0 < run["phases_s"]["total"] < run["ready_s"] == rep["ready_s_median"]
    assert "--threads" in rep["profile"] and rep["cpu"]


def test_missing_frames_are_the_gaps_in_stamped_indices() -> None:
    from worldcast.latency_bench.probe import _gaps

    assert _gaps([]) == 0 and _gaps([7]) == 0 and _gaps([1, 2, 3]) == 0
    assert _gaps([1, 2, 5, 6, 8]) == 3


@pytest.mark.parametrize("argv, message", [
    (["mtp", "--profile", "shared:max_batch=0"], "max_batch and max_sessions must be >= 1"),
    (["mtp", "--profile", "shared:admission=nope"], "admission must be"),
    (["load", "--trace", "no-such-trace"], "no trace 'no-such-trace'"),
    (["compare", "--url", "http://127.0.0.1:1"], "starts its own servers"),
    (["startup", "--runs", "0"], "need 1 <= --runs <= 50"),
    (["startup", "--profile", "shared:bogus=1"], "expected key=value"),
    (["mtp", "--profile", "statc"], "no profile preset 'statc'"),
])
def test_cli_rejects_bad_input_with_one_error_line(argv, message, capsys) -> None:  # type: ignore[no-untyped-def]
    from worldcast.latency_bench.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_concurrency_is_an_exact_sweep_and_reports_are_strict_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from worldcast.latency_bench.load import _concurrency

    assert _concurrency([(0.0, 2.0), (1.0, 3.0), (3.0, 3.068)], 4.0) == pytest.approx((2, (2 + 2 + 0.068) / 4))
    assert _concurrency([(0.0, 1.0), (1.0, 2.0)], 2.0)[0] == 1  # back to back is not overlap
    report.write_json(tmp_path / "r.json", {"ratio": float("inf"), "x": [float("nan"), 1.5]})
    assert json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: 1 / 0) == {
        "ratio": None, "x": [None, 1.5]}


async def test_close_is_bounded_even_if_the_reader_swallows_its_cancel(live_server) -> None:  # type: ignore[no-untyped-def]
    """CPython's 3.11 wait_for can swallow a cancel racing a frame; closing must not wait on that forever."""
    p = await SessionProbe.open(live_server.url, seed=6, stamped=False)
    await p.first_frame(30.0)
    p._reader.cancel()  # type: ignore[union-attr]  # stop the real reader; put a stubborn one in its place
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallowed, as the race does

    p._reader = asyncio.create_task(stubborn())
    t0 = time.monotonic()
    await p.close()
    assert time.monotonic() - t0 < 10.0
    release.set()
    await asyncio.wait({p._reader}, timeout=5.0)
    assert p._reader.done()
