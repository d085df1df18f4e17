"""The prepared device check runs its CPU part here (the GPU part needs a lent device)."""

from __future__ import annotations

import json

from worldcast.engine.gpu_check import main


def test_the_cpu_smoke_runs_the_served_causal_wan_path_and_reports_each_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["--cpu-smoke", "--skip-tests", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = report["engine"]["causal-wan:tiny"]
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["chunk_ms"] > 0 and r["pixel_fps_total"] > 0
        kinds = r["state_bytes_by_kind"]
        assert kinds["attention_ring"] > 0 and kinds["tensor"] > 0  # the KV ring and the VAE decoder's cache
        assert r["state_bytes_per_session"] == sum(kinds.values())
    chains = report["checkpoint_chains"]["causal-wan"]  # the family's checkpoint_check, loaded from generated files
    assert set(chains) == {"longlive", "self-forcing"}
    assert chains["longlive"]["model"] == "causal-wan:longlive" and chains["longlive"]["rows"]
    long = chains["self-forcing"]["long_session"]
    assert any(r["past_horizon"] for r in long) and not long[0]["past_horizon"]
    assert report["commit"]
