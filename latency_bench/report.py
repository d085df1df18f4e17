"""Reports: terminal tables (rich), a JSON file, and PNG plots (matplotlib).

Plots:
- `mtp_cdf.png`: motion-to-photon CDF per run (x: ms, y: share of actions);
- `timeline_<run>.png` for each load replay: per-session rows (grey: present,
  coloured: active, red ticks: 503 refusals) above the total delivered
  frames/s and the number of concurrently active sessions, 1 s bins.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, dict):
        return " / ".join(_fmt(x) for x in v.values())
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return str(v)


def table(title: str, columns: dict[str, dict[str, Any]], *, console: Console | None = None) -> None:
    """Print metrics side by side: one column per run, one row per metric (dict values as a/b/c)."""
    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    for name in columns:
        t.add_column(name, justify="right")
    keys: list[str] = []
    for col in columns.values():
        keys += [k for k in col if k not in keys]
    for k in keys:
        label = k + (" (" + "/".join(next(c[k] for c in columns.values() if k in c)) + ")"
                     if any(isinstance(c.get(k), dict) for c in columns.values()) else "")
        t.add_row(label, *(_fmt(c.get(k, "")) for c in columns.values()))
    (console or Console()).print(t)


def _strict(x: Any) -> Any:
    """NaN and infinities become null: strict JSON (RFC 8259) has no such numbers."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` as strict JSON (NaN and infinities as null)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_strict(data), indent=2, default=float, allow_nan=False))


def plot_mtp_cdf(series: dict[str, list[float]], path: Path) -> None:
    """One CDF of motion-to-photon samples (ms) per labelled run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, xs in series.items():
        if xs:
            x = np.sort(np.asarray(xs))
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=f"{label} (n={len(x)})")
    ax.set_xlabel("motion-to-photon, ms")
    ax.set_ylabel("share of actions")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(load: dict[str, Any], path: Path, *, seconds: float | None = None) -> None:
    """Per-session timeline of one load replay (`LoadResult.as_dict()`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sessions = load["sessions"]
    end = seconds or load["seconds"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 2 + 0.3 * len(sessions) + 2), sharex=True,
                                      gridspec_kw={"height_ratios": [max(1, len(sessions)) * 0.3, 2]})
    for i, s in enumerate(sessions):
        top.plot([s["arrive_s"], s["leave_s"]], [i, i], color="0.8", lw=6, solid_capstyle="butt")
        top.broken_barh([(a, b - a) for a, b in s["active"]], (i - 0.3, 0.6), color="tab:blue")
        for t in s.get("refused_s", []):
            top.plot([t], [i], "|", color="tab:red", ms=10)
    top.set_yticks(range(len(sessions)), [s["id"] for s in sessions], fontsize=7)
    top.set_title(f"{load['profile']} on {load['trace']}: present (grey), active (blue), refused (red)")
    bins = np.arange(0, end + 1.0, 1.0)
    times = np.concatenate([np.asarray(s.get("frame_times", []), float) for s in sessions] or [np.zeros(0)])
    counts, _ = np.histogram(times, bins)
    bottom.step(bins[:-1], counts, where="post", label="delivered frames/s (all sessions)")
    # time-weighted active sessions per bin
    active = [sum(max(0.0, min(b, t + 1.0) - max(a, t)) for s in sessions for a, b in s["active"]) for t in bins[:-1]]
    ax2 = bottom.twinx()
    ax2.step(bins[:-1], active, where="post", color="tab:orange", label="active sessions")
    ax2.set_ylabel("active sessions")
    bottom.set_ylabel("frames/s")
    bottom.set_xlabel("time since replay start, s")
    bottom.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
