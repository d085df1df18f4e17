"""The model-level GPU script runs its whole code path on the tiny config on CPU (--cpu-smoke)."""

from __future__ import annotations

import json
from pathlib import Path

from worldcast.models.causal_wan.gpu_check import main


def test_cpu_smoke_runs_the_gpu_check_path(tmp_path: Path) -> None:
    lines: list[str] = []
    out = tmp_path / "r.json"
    results = main(["--cpu-smoke", "--json", str(out)], out=lines.append)
    assert [r.batch for r in results] == [1, 2]
    for r in results:
        assert r.chunk_ms > 0 and r.pixel_fps_total == r.pixel_fps_per_session * r.batch
        assert abs(r.chunk_ms - (r.denoise_ms + r.commit_ms + r.decode_ms)) < 1e-6
    report = json.loads(out.read_text())
    assert report["state_bytes_per_session"]["decoder_cache"] > 0
    assert report["config"]["timesteps"][1] == 937.5
    assert any("per-session state bytes" in line for line in lines)
