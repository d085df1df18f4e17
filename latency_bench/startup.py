"""Start-up to ready: `worldcast serve` started N times in a row, each timed until `/readyz` answers.

    python -m worldcast.latency_bench startup --runs 3
    python -m worldcast.latency_bench startup --runs 3 --profile static:engines=2

Each run starts a fresh server process for the profile (`latency_bench/server.py`, polling
`/readyz` every 0.2 s), records the seconds from the process start to its first 200 and the
warm-up's phases from its `/metrics` (`worldcast_warmup_seconds{phase}` of the first ready
engine: threads, precision, buckets, packages, costs, total), then stops it. A first run after a change of
weights or versions fills the on-disk caches (compiled steps, the default prompt's embedding);
later runs show the warm-cache start-up.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from worldcast.latency_bench.server import ServerProfile, spawn


@dataclass
class StartupRun:
    """One start of a server.

    Attributes:
        ready_s: process start to the first 200 from `/readyz`, s (0.2 s resolution).
        phases_s: warm-up phase -> wall time, s, as the server exported them ({} when not exported).
    """

    ready_s: float
    phases_s: dict[str, float] = field(default_factory=dict)


def warmup_phases(url: str) -> dict[str, float]:
    """`worldcast_warmup_seconds` by phase from the server's `/metrics`, s ({} if it exports none).

    Raises:
        httpx.HTTPError: the server did not answer.
    """
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {s.labels["phase"]: float(s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "worldcast_warmup_seconds" and "phase" in s.labels}


def measure(profile: ServerProfile, *, runs: int) -> list[StartupRun]:
    """Start and stop a server for `profile` `runs` times, one after another.

    Raises:
        ValueError: runs < 1.
        RuntimeError: a server exited or was not ready in time (its log is quoted).
    """
    if runs < 1:
        raise ValueError("need at least one run")
    out = []
    for _ in range(runs):
        t0 = time.monotonic()
        with spawn(profile) as url:
            ready_s = time.monotonic() - t0
            out.append(StartupRun(ready_s, warmup_phases(url)))
    return out


def summary(runs: list[StartupRun]) -> dict[str, Any]:
    """Per run its ready time and phases, and the median ready time, for `report.table` and report.json."""
    return {"runs": [asdict(r) for r in runs], "ready_s_median": statistics.median(r.ready_s for r in runs)}


def columns(runs: list[StartupRun]) -> dict[str, dict[str, Any]]:
    """One table column per run: ready, each warm-up phase, and ready less the warm-up (imports before it;
    after it the encoders' load and the app's start), all s."""
    cols = {}
    for i, r in enumerate(runs):
        col: dict[str, Any] = {"to ready (s)": round(r.ready_s, 1)}
        col |= {f"warm-up {k} (s)": round(v, 1) for k, v in r.phases_s.items()}
        if "total" in r.phases_s:
            col["ready less warm-up (s)"] = round(r.ready_s - r.phases_s["total"], 1)
        cols[f"run {i + 1}"] = col
    return cols


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, with whether it has AMX, AVX-512 bf16, AVX2 ("" elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    have = [f for f in ("amx_bf16", "avx512_bf16", "avx2") if f in flags]
    return f"{name} ({', '.join(have) or 'none of amx_bf16, avx512_bf16, avx2'})"
