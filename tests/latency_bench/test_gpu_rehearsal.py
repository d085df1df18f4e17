"""The rehearsal of the device check (`make gpu-rehearsal`): the check, end to end on the CPU at tiny sizes, in a
virtual environment with only what the lent GPU image holds that it imports plus the carried wheels, offline.

The environment is built once (network, a few minutes) and cached under ~/.cache/worldcast; the check itself then
takes a few minutes on a busy 2-core machine. Timing numbers are not asserted (load varies); what ran is.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from worldcast.latency_bench.gpu_check.launch import REPO
from worldcast.latency_bench.gpu_check.runner import PARTS


@pytest.mark.slow
@pytest.mark.timeout(2400)  # a cold cache builds the environment first
def test_the_device_check_runs_end_to_end_in_the_lent_images_packages(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    t0 = time.monotonic()
    t = subprocess.run(["make", "--no-print-directory", "gpu-rehearsal", f"REHEARSAL_OUT={tmp_path}"], cwd=REPO,
                       capture_output=True, text=True, timeout=2300)
    took_s = time.monotonic() - t0
    report_path = tmp_path / "gpu_check.json"
    assert report_path.exists(), f"no report (exit {t.returncode}):\n{t.stdout[-4000:]}\n{t.stderr[-4000:]}"
    report = json.loads(report_path.read_text())
    parts = report["parts"]
    assert list(parts) == [p.name for p in PARTS]
    failed = {n: (r["status"], r.get("error"), r.get("log_tail", "")[-1500:]) for n, r in parts.items()
              if r["status"] != ("n/a" if n == "tinyworld_graphs" else "ok")}
    assert not failed and t.returncode == 0, failed
    assert report["mode"] == "cpu" and report["passed"] is True
    print(f"rehearsal: {took_s:.0f} s in all, the check {report['wall_s']} s")

    env = parts["environment"]["result"]
    assert env["network_edge_present"] == []  # the environment is the image's, not the project's .venv
    assert env["device"] == "cpu"
    tests = parts["pytest_gpu"]["result"]
    assert tests["returncode"] == 0 and tests["counts"].get("skipped", 0) >= 5  # collected, skipped without CUDA
    assert parts["ring_attention"]["result"]["passed"] is True
    wan, mg = parts["causal_wan"]["result"], parts["matrix_game"]["result"]
    assert wan["model"] == "causal-wan:tiny" and [r["batch"] for r in wan["rows"]] == [1, 2]
    assert mg["model"] == "matrix-game-2:tiny" and [r["batch"] for r in mg["rows"]] == [1, 3]
    for res in (wan, mg):
        assert res["state_plan"]["num_slots"] >= 1 and all(r["chunk_ms"] > 0 for r in res["rows"])
    bench = parts["tinyworld_eager"]["result"]
    assert [(r["cuda_graphs"], r["sessions"]) for r in bench["rows"]] == [(False, 1), (False, 2)]
    assert parts["tinyworld_graphs"]["error"] == "CUDA graphs need CUDA"
    table = (tmp_path / "gpu_check.txt").read_text()
    assert "passed" in table.splitlines()[0] and all(p.name in table for p in PARTS)
