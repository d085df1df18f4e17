"""The soak and flood commands' measuring parts, short, against a real server: what they report, not how fast."""

from __future__ import annotations

import pytest

from worldcast.latency_bench import flood, soak

pytestmark = pytest.mark.timeout(300)


async def test_a_short_soak_reports_drift_pts_and_leaks(live_server) -> None:  # type: ignore[no-untyped-def]
    r = await soak.soak(live_server.url, minutes=0.25, sessions=1, action_hz=4.0, sample_s=2.0, warmup_minutes=0.05,
                        mtp_window_s=5.0)
    assert r["frames"] > 0 and r["pts_not_increasing"] == [0]
    assert len(r["samples"]) >= 3 and all(s["rss_bytes"] > 0 and s["fds"] > 0 for s in r["samples"])
    assert r["mtp_ms"]["start"]["p50"] > 0 and r["mtp_ms"]["end"]["p50"] > 0
    assert r["leaks"]["peers"] == 0 and set(r["leaks"]) == {"fds", "threads", "tasks", "peers"}
    assert set(r["bars"]) == {"rss_growth_le_5pct", "mtp_p50_end_within_10pct", "no_leaks", "pts_monotonic"}


async def test_the_flood_command_floods_and_measures_a_neighbour(live_server) -> None:  # type: ignore[no-untyped-def]
    r = await flood.run(live_server.url, seconds=3.0, rate=1000.0)
    assert set(r["victim_fps"]) == {"quiet", "burner", "flood"} and r["victim_fps"]["quiet"] > 0
    assert r["flooder"]["sent"] > 500
    counts = r["server_counts_during_flood"]
    assert counts.get("actions:parse_error", 0) + counts.get("actions:rate_limited", 0) > 0, counts
    assert r["flooder"]["events_back"] < r["flooder"]["sent"] / 20  # coalesced: far fewer replies than messages


async def test_process_metric_reads_the_servers_own_samples(live_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.latency_bench.server import process_metric

    rss = await process_metric(live_server.url, "process_resident_memory_bytes")
    assert rss > 50 * 2**20  # a server with torch and a model loaded
    cpu0 = await process_metric(live_server.url, "process_cpu_seconds_total")
    cpu1 = await process_metric(live_server.url, "process_cpu_seconds_total")
    assert 0 < cpu0 <= cpu1
    with pytest.raises(RuntimeError, match="no worldcast_no_such_sample"):
        await process_metric(live_server.url, "worldcast_no_such_sample")


def test_resident_memory_adds_each_engine_process() -> None:
    """`rss` and `soak` read the server's RSS with its engine processes' (`server.resident_bytes`)."""
    from worldcast.latency_bench.server import ENGINE_RSS, resident_bytes

    assert resident_bytes({"process_resident_memory_bytes": [100.0]}) == 100.0  # an engine in the server's process
    assert resident_bytes({"process_resident_memory_bytes": [100.0], ENGINE_RSS: [30.0, 20.0]}) == 150.0
    assert resident_bytes({ENGINE_RSS: [30.0]}) != resident_bytes({ENGINE_RSS: [30.0]})  # NaN: no server figure


async def test_rss_reads_a_server_with_its_engine_in_process(live_server) -> None:  # type: ignore[no-untyped-def]
    from worldcast.latency_bench.rss import rss_bytes
    from worldcast.latency_bench.server import ENGINE_RSS, metric_samples

    samples = await metric_samples(live_server.url)
    assert ENGINE_RSS not in samples  # the test server's engine runs in its process: no engine process to add
    assert await rss_bytes(live_server.url) == pytest.approx(samples["process_resident_memory_bytes"][0], rel=0.2)
