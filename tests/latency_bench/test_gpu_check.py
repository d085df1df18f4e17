"""The prepared device check: each part isolated in its own process, the report and table, and the parts' CPU
paths (the whole check in the lent image's packages is `test_gpu_rehearsal.py`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from worldcast.latency_bench.gpu_check import parts as gpu_check_parts
from worldcast.latency_bench.gpu_check.runner import GPU_BUDGET_S, PARTS, Part, run_check, table

# Parts for the isolation test, run by the check in processes of their own (`tests.latency_bench.test_gpu_check:...`).


def part_ok(cpu: bool) -> dict[str, object]:
    return {"cpu": cpu, "value": 42}


def part_raises(cpu: bool) -> dict[str, object]:
    raise RuntimeError("planted failure in a part")


def part_hangs(cpu: bool) -> dict[str, object]:
    time.sleep(600)
    return {}


def part_not_passed(cpu: bool) -> dict[str, object]:
    return {"passed": False, "why": "a checked number out of bounds"}


def part_not_here(cpu: bool) -> dict[str, object]:
    return {"not_applicable": "needs something this machine lacks"}


def _fake(name: str, fn: str, timeout_s: float = 300) -> Part:
    return Part(name, f"tests.latency_bench.test_gpu_check:{fn}", timeout_s, timeout_s)


def test_a_failing_or_hanging_part_is_reported_and_the_rest_still_runs(tmp_path: Path) -> None:
    parts = [_fake("raises", "part_raises"), _fake("hangs", "part_hangs", timeout_s=20),
             _fake("not_passed", "part_not_passed"), _fake("not_here", "part_not_here"), _fake("ok", "part_ok")]
    t0 = time.monotonic()
    report = run_check(parts, cpu=True, out=tmp_path, budget_s=900)
    assert time.monotonic() - t0 < 300, "the hanging part was not killed at its timeout"
    rows = report["parts"]
    assert [rows[n]["status"] for n in ("raises", "hangs", "not_passed", "not_here", "ok")] == [
        "failed", "timeout", "failed", "n/a", "ok"]
    assert rows["not_here"]["error"] == "needs something this machine lacks"
    assert "RuntimeError: planted failure in a part" in rows["raises"]["error"]
    assert "Traceback" in rows["raises"]["log_tail"] and "part_raises" in rows["raises"]["log_tail"]
    assert rows["hangs"]["returncode"] is None and rows["hangs"]["timeout_s"] == 20
    assert rows["not_passed"]["result"]["why"] == "a checked number out of bounds"
    assert rows["ok"]["result"] == {"cpu": True, "value": 42} and "log_tail" not in rows["ok"]
    assert report["passed"] is False
    on_disk = json.loads((tmp_path / "gpu_check.json").read_text())
    assert on_disk["parts"]["ok"]["status"] == "ok" and on_disk["commit"]
    text = (tmp_path / "gpu_check.txt").read_text()
    assert "FAILED" in text and "timeout" in text
    assert "==== raises" in (tmp_path / "gpu_check.log").read_text()


def test_parts_beyond_the_budget_are_skipped_not_started(tmp_path: Path) -> None:
    report = run_check([_fake("hangs", "part_hangs", timeout_s=600), _fake("ok", "part_ok")], cpu=True,
                       out=tmp_path, budget_s=25)
    assert report["parts"]["hangs"]["status"] == "timeout" and report["parts"]["hangs"]["timeout_s"] <= 25
    assert report["parts"]["ok"]["status"] == "skipped"
    assert report["passed"] is False


def test_parts_that_do_not_apply_leave_the_check_passed(tmp_path: Path) -> None:
    report = run_check([_fake("not_here", "part_not_here"), _fake("ok", "part_ok")], cpu=True, out=tmp_path,
                       budget_s=300)
    assert [r["status"] for r in report["parts"].values()] == ["n/a", "ok"] and report["passed"] is True


def test_the_default_parts_fit_the_gpu_budget_in_order() -> None:
    assert [p.name for p in PARTS] == ["environment", "pytest_gpu", "ring_attention", "causal_wan", "matrix_game",
                                       "tinyworld_eager", "tinyworld_graphs"]
    assert GPU_BUDGET_S < 8 * 60 and all(p.gpu_timeout_s <= GPU_BUDGET_S for p in PARTS)  # issue 34: under 8 min
    with pytest.raises(ValueError, match="module:function"):
        Part("x", "no_colon", 1, 1)


def test_the_table_has_a_line_per_part_with_its_headline() -> None:
    report = {"mode": "gpu", "commit": "abc", "passed": False, "wall_s": 12.0, "parts": {
        "causal_wan": {"status": "ok", "wall_s": 30.0, "peak_memory_bytes": 3 * 2**30, "error": None, "result": {
            "state_plan": {"slot_bytes": 2**30, "num_slots": 9},
            "rows": [{"batch": 1, "chunk_ms": 250.0, "pixel_fps_per_session": 48.0}]}},
        "matrix_game": {"status": "timeout", "wall_s": 120.0, "error": "killed after 120 s"}}}
    lines = table(report)
    assert "FAILED" in lines[0]
    assert "3.00 GiB" in lines[2] and "1x: 250 ms/chunk, 48.0 fps/session" in lines[2] and "holds 9" in lines[2]
    assert "timeout" in lines[3] and "killed after 120 s" in lines[3]


def test_ring_attention_part_checks_the_pytorch_path_against_the_reference_on_the_cpu() -> None:
    out = gpu_check_parts.ring_attention(True)
    assert out["passed"] is True and [r["dtype"] for r in out["rows"]] == ["float32", "bfloat16"]
    for r in out["rows"]:
        assert r["triton_ms"] is None and r["torch_ms"] > 0
        assert r["torch_vs_reference_max_abs_err"] < r["tolerance"]


def test_engine_model_part_reports_rows_and_the_state_plan_per_session_count() -> None:
    out = gpu_check_parts.causal_wan(True)
    assert out["model"] == "causal-wan:tiny" and [r["batch"] for r in out["rows"]] == [1, 2]
    plan = out["state_plan"]
    assert plan["num_slots"] >= 1 and plan["slot_bytes"] == sum(plan["by_kind"].values())
    for r in out["rows"]:
        assert r["chunk_ms"] > 0 and r["pixel_fps_total"] > 0
        kinds = r["state_bytes_by_kind"]
        assert kinds["attention_ring"] > 0 and kinds["tensor"] > 0  # the KV ring and the VAE decoder's cache
        assert r["state_bytes_per_session"] == sum(kinds.values()) == plan["slot_bytes"]


@pytest.mark.slow
def test_the_opt_in_checkpoint_chains_part_loads_each_family_from_generated_files() -> None:
    report = gpu_check_parts.checkpoint_chains(True)
    chains = report["causal-wan"]
    assert set(chains) == {"longlive", "self-forcing"}
    assert chains["longlive"]["model"] == "causal-wan:longlive" and chains["longlive"]["rows"]
    long = chains["self-forcing"]["long_session"]
    assert any(r["past_horizon"] for r in long) and not long[0]["past_horizon"]
