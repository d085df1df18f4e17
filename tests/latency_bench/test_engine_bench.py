"""The scheduler benchmark runs end to end and reports consistent numbers (not the numbers themselves)."""

import gc

from worldcast.latency_bench.engine_bench import _FullCollections, run_mode


def test_bench_batches_always_active_sessions_in_lock_step_and_not_when_told_not_to(model) -> None:  # type: ignore[no-untyped-def]
    on = run_mode(model, sessions=2, seconds=1.5, max_batch=2, threads=1, warmup_s=0.5)
    off = run_mode(model, sessions=2, seconds=1.5, max_batch=1, threads=1, warmup_s=0.5)
    assert on["mean_step_batch"] > 1.5, "two always-active sessions on one deadline grid run as one batch"
    assert off["mean_step_batch"] == 1.0
    assert on["total_fps"] > 0 and off["total_fps"] > 0
    assert set(on["full_gc"]) == {"count", "max_ms"}, "the report says how many full collections ran and the longest"


def test_the_bench_times_full_collections_only() -> None:
    seen = _FullCollections()
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: only the ones below run
    gc.callbacks.append(seen)
    try:
        gc.collect(0)
        gc.collect(1)
        assert seen.took_s == []
        gc.collect()
        gc.collect(2)
    finally:
        gc.callbacks.remove(seen)
        if was_enabled:
            gc.enable()
    assert len(seen.took_s) == 2 and all(t >= 0.0 for t in seen.took_s)


def test_bench_faults_end_only_their_victims(model) -> None:  # type: ignore[no-untyped-def]
    from worldcast.latency_bench.engine_bench import run_faults

    r = run_faults(model, sessions=1, seconds=3.0, threads=1)
    assert r["cancel"]["victim_steps_started_after"] <= 1 and r["cancel"]["victim_frames_published_after"] == 0
    assert not r["cancel"]["victim_ended_with_error"]
    for fault, text in (("raise", "injected failure"), ("nan", "non-finite")):
        assert r[fault]["victim_ended_with_error"] and text in r[fault]["error"]
        assert r[fault]["others_frames_next_1s"] > 0  # the other session kept going


def test_admission_replay_follows_the_trace_and_the_policy(model) -> None:  # type: ignore[no-untyped-def]
    from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
    from worldcast.latency_bench.admission_bench import replay

    trace = {"format": "worldcast-trace/1", "duration_s": 3.0, "sessions": [
        {"id": "a", "arrive_s": 0.0, "leave_s": 3.0, "segments": [
            {"start_s": 0.0, "end_s": 1.5, "state": "active"}, {"start_s": 1.5, "end_s": 3.0, "state": "idle"}]},
        {"id": "b", "arrive_s": 0.5, "leave_s": 2.0, "segments": [{"start_s": 0.5, "end_s": 2.0, "state": "active"}]},
    ]}
    r = replay(model, trace, AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=1, retry_after_s=0.3),
               threads=1)
    assert (r["arrived"], r["admitted"], r["peak_admitted_at_once"]) == (2, 1, 1)
    assert r["refusals"] >= 3  # b asked every 0.3 s while a held the only place
    assert r["frames"] > 5 and 0.0 <= r["on_time_share"] <= 1.0


def test_the_gil_bench_measures_each_way_and_stops_its_device_thread(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`--gil`: one row per way that runs here (eager, graphs; packages only where built), each with oversleeps
    (never negative: a sleep lasts at least what was asked) and the chunk's own time; no thread left behind.
    Fake compiler: `torch.compile` returns the step itself, so "graphs" need no build."""
    import threading

    import torch

    from worldcast.latency_bench.gil_bench import measure_gil
    from worldcast.models.tinyworld import TinyWorldModel

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # an empty cache: no packages can be found
    m = TinyWorldModel.from_pretrained()
    rows = measure_gil(m, torch.float32, samples=20)
    assert [r["mode"] for r in rows] == ["eager", "compiled"]
    for r in rows:
        assert 0 <= r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"] and r["chunk_ms"] > 0
    assert not any(t.name == "gil-bench-device" for t in threading.enumerate())
    assert m.precision is torch.float32
