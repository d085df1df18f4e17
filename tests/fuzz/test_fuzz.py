"""The fuzz harness at a small count (CI): every surface, pure and live, 0 crashes, a second session streaming.

The full run is `python -m tests.fuzz` (10,000 cases per surface; BENCHMARKS.md, RELIABILITY).
"""

from __future__ import annotations

import pytest

from tests.fuzz.__main__ import run

pytestmark = pytest.mark.timeout(600)


def test_every_surface_survives_a_small_fuzz_with_a_second_session_streaming() -> None:
    report = run(300, 150, 0, {"actions", "rpc", "sdp", "http"}, http_cases=120)
    by = {(s["surface"], s["level"]): s for s in report["surfaces"]}
    assert set(by) == {("actions", "pure"), ("rpc", "pure"), ("sdp", "pure"), ("actions", "live"),
                       ("rpc", "live"), ("sdp", "live"), ("http", "live")}
    for key, s in by.items():
        assert s["cases"] > 0, key
        assert s["crash_count"] == 0, (key, s["crashes"])
    # the other session kept streaming: a gap over MAX_WATCH_GAP_S counts as a crash above
    assert sum(s["watcher"]["frames"] for s in report["surfaces"] if s["level"] == "live") > 0
    assert report["server_error_count"] == 0, report["server_errors"]
    # the cases reach past the first check: refusals of several kinds, and some accepted
    assert len(by[("rpc", "pure")]["outcomes"]) >= 4 and by[("sdp", "pure")]["outcomes"].get("accepted", 0) > 0
