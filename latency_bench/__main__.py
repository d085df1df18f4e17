"""worldcast latency benchmark: motion-to-photon, TTFF and SLO attainment through the real transports.

    python -m worldcast.latency_bench default                      # the default profile (< 3 min)
    python -m worldcast.latency_bench mtp --sessions 2 --seconds 20
    python -m worldcast.latency_bench mtp --transport fmp4          # WebSocket fMP4 beside WebRTC
    python -m worldcast.latency_bench load --trace duty30-short --profile duty-cycle
    python -m worldcast.latency_bench compare --a shared --b baseline --trace duty30-short
    python -m worldcast.latency_bench mtp --sessions 2 --profile static:engines=2   # two engine processes
    python -m worldcast.latency_bench engines --kills 3 --moves 10                  # crash and move costs
    python -m worldcast.latency_bench startup --runs 3                              # start-up to ready

Without --url each run starts its own server (`worldcast serve` in a child
process on a free loopback port, ICE pinned to 127.0.0.1) from a profile
(see `latency_bench/server.py`: shared, baseline, duty-cycle, always-on, or
name:key=value,...). Transport: WebRTC (aiortc client); `mtp --transport
livekit` measures through a LiveKit SFU beside direct WebRTC in one run
(`livekit_mtp.py`). Every run writes
report.json and PNG plots to --out (default bench_results/<time>/).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from worldcast.latency_bench import fmp4 as fmp4_mod
from worldcast.latency_bench import load as load_mod
from worldcast.latency_bench import mtp as mtp_mod
from worldcast.latency_bench import report
from worldcast.latency_bench.server import ServerProfile, spawn
from worldcast.latency_bench.trace import Trace, load_trace

#: Traces shipped with the tool, by name.
TRACES_DIR = Path(__file__).resolve().parent / "traces"
TRANSPORT = "webrtc"
#: Transports the benchmark can drive (fmp4 and livekit: mtp only, each beside WebRTC on one server).
TRANSPORTS = [TRANSPORT, "fmp4", "livekit"]


def resolve_trace(name_or_path: str) -> Trace:
    """A shipped trace by name (e.g. duty30-short) or a trace file.

    Raises:
        ValueError: not found or invalid.
    """
    p = Path(name_or_path)
    if not name_or_path or not p.is_file():
        p = TRACES_DIR / f"{name_or_path}.json"
    if not name_or_path or not p.is_file():
        shipped = sorted(x.stem for x in TRACES_DIR.glob("*.json"))
        raise ValueError(f"no trace {name_or_path!r}: give a file or one of {shipped}")
    return load_trace(p)


@contextlib.contextmanager
def server_for(url: str | None, profile: ServerProfile) -> Iterator[str]:
    if url:
        yield url
    else:
        with spawn(profile) as u:
            yield u


def run_mtp(url: str | None, profile: ServerProfile, args: argparse.Namespace) -> dict[str, Any]:
    with server_for(url, profile) as u:
        res = asyncio.run(mtp_mod.run(u, sessions=args.sessions, seconds=args.seconds, action_hz=args.action_hz))
    return {"profile": profile.name, "transport": TRANSPORT, "summary": mtp_mod.report(res),
            "samples_ms": [x for r in res for x in r.mtp_ms]}


def run_load(url: str | None, profile: ServerProfile, trace: Trace, slo: load_mod.SLO) -> dict[str, Any]:
    with server_for(url, profile) as u:
        res = asyncio.run(load_mod.replay(u, trace, profile=profile.name, slo=slo))
    d = res.as_dict()
    d["samples_ms"] = [x for s in res.sessions if s.metrics for x in s.metrics.mtp_ms]
    return d


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per metric: A's value, B's value, and A over B (None when undefined: B is 0)."""
    sa, sb = a["summary"], b["summary"]
    pairs = {"mtp_p50_ms": (sa["mtp_ms"]["p50"], sb["mtp_ms"]["p50"]),
             "mtp_p95_ms": (sa["mtp_ms"]["p95"], sb["mtp_ms"]["p95"])}
    if "slo_attainment" in sa:
        pairs |= {k: (sa[k], sb[k]) for k in ("admitted", "served_within_slo", "slo_attainment", "goodput_fps")}
    else:
        pairs |= {"fps_mean": (sa["fps_mean"], sb["fps_mean"])}
    return {k: {"a": x, "b": y, "a_over_b": x / y if y else None} for k, (x, y) in pairs.items()}


def _mtp_columns(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{r['profile']} / {r['transport']}": r["summary"] for r in runs}


def _load_columns(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{r['profile']} / {r['trace']}": r["summary"] for r in runs}


def finish(out: Path, data: dict[str, Any]) -> None:
    """Print tables, write report.json and plots."""
    mtp_runs = [r for r in data["runs"] if r["kind"] == "mtp"]
    load_runs = [r for r in data["runs"] if r["kind"] == "load"]
    if mtp_runs:
        report.table("motion-to-photon (ms: p50 / p95 / p99)", _mtp_columns(mtp_runs))
    direction_runs = [r for r in data["runs"] if r["kind"] == "direction"]
    if direction_runs:
        report.table("direction (fmp4) / set_prompt + flush (webrtc) to first frame (ms: p50 / p95 / p99)",
                     _mtp_columns(direction_runs))
    if load_runs:
        report.table("trace replay", _load_columns(load_runs))
        for r in load_runs:
            report.plot_timeline(r, out / f"timeline_{r['profile']}.png")
    if "ratios" in data:
        report.table(f"compare: A = {data['a']}, B = {data['b']}", {"A / B / A over B": data["ratios"]})
    report.plot_mtp_cdf({f"{r['kind']} {r['profile']}" + (f" {r['transport']}" if r.get("transport") else ""):
                         r["samples_ms"] for r in data["runs"]}, out / "mtp_cdf.png")
    report.write_json(out / "report.json", data)
    print(f"report: {out / 'report.json'} (plots beside it)")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the docstring's layout and show defaults."""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    fmt = _Formatter
    prof_help = ("server profile: a preset (shared, baseline, duty-cycle, always-on, static) or "
                 "name:key=value,... (see latency_bench/server.py)")

    def common(p: argparse.ArgumentParser, *, mtp: bool, slo: bool) -> None:
        p.add_argument("--url", default=None, help="benchmark a running server instead of starting one")
        p.add_argument("--transport", choices=TRANSPORTS, default="webrtc",
                       help="how sessions connect: webrtc (aiortc); fmp4 (mtp only: the WebSocket stream "
                            "and direction-to-first-frame); livekit (mtp only: through a LiveKit SFU); each "
                            "beside WebRTC on the same server")
        p.add_argument("--out", type=Path, default=None, help="report folder (default: bench_results/<time>)")
        p.add_argument("--model", default=None, metavar="NAME[:VARIANT]",
                       help="the model the started servers serve, from the registry (default: the server's); "
                            "the probes' actions come from its declared keys")
        if mtp:
            p.add_argument("--action-hz", type=float, default=4.0, help="mtp: actions per second per session")
            p.add_argument("--sessions", type=int, default=1, help="mtp: concurrent always-active sessions")
            p.add_argument("--seconds", type=float, default=15.0, help="mtp: measured seconds")
            p.add_argument("--livekit-source", choices=["raw", "encoded"], default="raw",
                           help="mtp --transport livekit: the server's LiveKit video source")
        if slo:
            p.add_argument("--slo-mtp-ms", type=float, default=load_mod.SLO.mtp_p95_ms, help="SLO: MTP p95 bound, ms")
            p.add_argument("--slo-fps-share", type=float, default=load_mod.SLO.min_fps_share,
                           help="SLO: least delivered frames/s while active, as a share of the model's fps")

    p = sub.add_parser("mtp", help="motion-to-photon, TTFF and pacing for N always-active sessions",
                       formatter_class=fmt)
    common(p, mtp=True, slo=False)
    p.add_argument("--profile", default="static", help=prof_help + "; static admits all N sessions")
    p = sub.add_parser("load", help="replay a duty-cycle trace: SLO attainment and goodput", formatter_class=fmt)
    common(p, mtp=False, slo=True)
    p.add_argument("--profile", default="duty-cycle", help=prof_help)
    p.add_argument("--trace", default="duty30-short", help="shipped trace name or a trace file")
    p = sub.add_parser("compare", help="two server profiles, one after the other, same workload; ratios A/B",
                       formatter_class=fmt)
    common(p, mtp=True, slo=True)
    p.add_argument("--a", default="shared", help="profile A, " + prof_help)
    p.add_argument("--b", default="baseline", help="profile B (the denominator of the ratios)")
    p.add_argument("--trace", default="duty30-short",
                   help="shipped trace name or file; 'none': the mtp workload (--sessions, --seconds)")
    p = sub.add_parser("default", help="the default profile: mtp for one session (10 s), then shared vs baseline "
                                       "on the short trace", formatter_class=fmt)
    common(p, mtp=False, slo=True)
    p = sub.add_parser("engines", help="two engine processes: kill one (engine_lost, restart, the other "
                                       "session's frames), then move a streaming session back and forth",
                       formatter_class=fmt)
    p.add_argument("--url", default=None, help="a running server with two engines (needs --admin-token)")
    p.add_argument("--admin-token", default=None, help="with --url: the server's admin token")
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs of an engine process, one after another")
    p.add_argument("--moves", type=int, default=10, help="moves of one streaming session")
    p.add_argument("--out", type=Path, default=None, help="report folder (default: bench_results/<time>)")
    p = sub.add_parser("startup", help="start-up to ready: a server started --runs times in a row, with its "
                                       "warm-up phases", formatter_class=fmt,
                       description="Start a server --runs times, one after another; each is timed from its process "
                                   "start to the first 200 from /readyz (s), with its warm-up phases from /metrics "
                                   "(s) and what came after the warm-up (the encoders' load, the app's start).")
    p.add_argument("--runs", type=int, default=3, help="servers started, one after another")
    p.add_argument("--profile", default="static", help=prof_help)
    p.add_argument("--out", type=Path, default=None, help="report folder (default: bench_results/<time>)")
    args = ap.parse_args(argv)
    if args.command == "engines":
        run_engines(ap, args)
        return
    if args.command == "startup":
        run_startup(ap, args)
        return

    out = args.out or Path("bench_results") / time.strftime("%Y%m%d-%H%M%S")
    slo = load_mod.SLO(getattr(args, "slo_mtp_ms", load_mod.SLO.mtp_p95_ms),
                       getattr(args, "slo_fps_share", load_mod.SLO.min_fps_share))
    data: dict[str, Any] = {"command": args.command, "machine": platform.platform(),
                            "processor": platform.processor() or platform.machine(), "runs": []}
    try:  # bad input is an error line, not a traceback
        if hasattr(args, "sessions") and not (
                1 <= args.sessions <= 64 and 0 < args.action_hz <= 1000 and 0 < args.seconds <= 3600):
            raise ValueError("need 1 <= --sessions <= 64, 0 < --action-hz <= 1000, 0 < --seconds <= 3600")
        if hasattr(args, "slo_mtp_ms") and not (args.slo_mtp_ms > 0 and 0 <= args.slo_fps_share <= 1):
            raise ValueError("need --slo-mtp-ms > 0 and 0 <= --slo-fps-share <= 1")
        if getattr(args, "transport", TRANSPORT) == "fmp4" and args.command != "mtp":
            raise ValueError("--transport fmp4 applies to mtp (it runs WebRTC beside it)")
        if getattr(args, "transport", TRANSPORT) == "livekit" and args.command != "mtp":
            raise ValueError("--transport livekit applies to mtp (it runs WebRTC beside it)")
        if args.url and args.command in ("default", "compare"):
            raise ValueError(f"{args.command} starts its own servers: drop --url")
        names = {"mtp": [getattr(args, "profile", "")], "load": [getattr(args, "profile", "")],
                 "default": ["shared", "baseline"], "compare": [getattr(args, "a", ""), getattr(args, "b", "")]}
        profiles = [ServerProfile.parse(n) for n in names[args.command]]
        if args.model is not None:
            profiles = [dataclasses.replace(p, model=args.model) for p in profiles]
        trace_name = {"default": "duty30-short"}.get(args.command, getattr(args, "trace", "none"))
        trace = None if trace_name in (None, "none") or args.command == "mtp" else resolve_trace(trace_name)
    except ValueError as e:
        ap.error(str(e))
    try:
        run(args, profiles, trace, slo, data)
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    except httpx.HTTPStatusError as e:
        hint = ""
        if e.response.status_code == 503:
            hint = (" (the server refused a session; for always-active sessions use --profile static, "
                    "or fewer --sessions)")
        raise SystemExit(f"error: {e.response.status_code} {e.response.text[:200]}{hint}") from None
    except Exception as e:  # noqa: BLE001 - one line for the user; the server log (if any) has details
        where = f" ({args.url})" if args.url else ""
        raise SystemExit(f"error{where}: {type(e).__name__}: {e}") from None
    finish(out, data)


def run_startup(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`startup`: start-up to ready, `--runs` servers in a row (latency_bench/startup.py)."""
    from worldcast.latency_bench import startup as startup_mod

    if not 1 <= args.runs <= 50:
        ap.error("need 1 <= --runs <= 50")
    try:
        profile = ServerProfile.parse(args.profile)
    except ValueError as e:
        ap.error(str(e))
    out = args.out or Path("bench_results") / time.strftime("%Y%m%d-%H%M%S")
    try:
        runs = startup_mod.measure(profile, runs=args.runs)
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise SystemExit(f"error: {type(e).__name__}: {e}") from None
    report.table(f"start-up to ready ({profile.name})", startup_mod.columns(runs))
    data = {"command": "startup", "machine": platform.platform(), "processor": platform.processor() or
            platform.machine(), "cpu": startup_mod.cpu_model(), "profile": profile.flags()} | startup_mod.summary(runs)
    report.write_json(out / "report.json", data)
    print(f"report: {out / 'report.json'}")


def run_engines(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`engines`: kill and move measurements (latency_bench/engines.py) on a server with two engine processes."""
    from worldcast.latency_bench import engines as engines_mod

    if args.url and not args.admin_token and (args.moves or args.kills):
        ap.error("--url needs --admin-token (kills read pids from GET /v1/engines; moves are operator calls)")
    if not (0 <= args.kills <= 100 and 0 <= args.moves <= 1000):
        ap.error("need 0 <= --kills <= 100 and 0 <= --moves <= 1000")
    token = args.admin_token or engines_mod.new_token()
    profile = ServerProfile.parse("static:engines=2,max_sessions=4")
    out = args.out or Path("bench_results") / time.strftime("%Y%m%d-%H%M%S")
    try:
        if args.url:
            rep = asyncio.run(engines_mod.run(args.url, admin_token=token, kills=args.kills, move_count=args.moves))
        else:
            with spawn(profile, extra_flags=["--admin-token", token]) as url:
                rep = asyncio.run(engines_mod.run(url, admin_token=token, kills=args.kills, move_count=args.moves))
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise SystemExit(f"error: {type(e).__name__}: {e}") from None
    data = {"command": "engines", "machine": platform.platform(), "profile": profile.flags()} | rep.as_dict()
    report.table("engines (kill, move)", {"two engine processes": rep.summary()})
    report.write_json(out / "report.json", data)
    print(f"report: {out / 'report.json'}")


def run(args: argparse.Namespace, profiles: list[ServerProfile], trace: Trace | None, slo: load_mod.SLO,
        data: dict[str, Any]) -> None:
    """Run the chosen command; results are appended to `data`."""
    if args.command == "mtp" and args.transport == "fmp4":  # the WebSocket stream beside WebRTC, one server
        with server_for(args.url, profiles[0]) as u:
            data["runs"] += fmp4_mod.side_by_side(u, profile=profiles[0].name, sessions=args.sessions,
                                                  seconds=args.seconds, action_hz=args.action_hz)
    elif args.command == "mtp" and args.transport == "livekit":  # through the SFU beside WebRTC, one server
        from worldcast.latency_bench import livekit_mtp

        data["runs"] += [{"kind": "mtp"} | r for r in livekit_mtp.run(args.url, profiles[0], args)]
    elif args.command == "mtp":
        data["runs"].append({"kind": "mtp"} | run_mtp(args.url, profiles[0], args))
    elif args.command == "load":
        assert trace is not None
        data["runs"].append({"kind": "load"} | run_load(args.url, profiles[0], trace, slo))
    elif args.command == "default":  # one server per profile: mtp then the trace on shared, the trace on baseline
        assert trace is not None
        args.seconds, args.sessions, args.action_hz = 10.0, 1, 4.0
        a, b = profiles
        with spawn(a) as url:
            data["runs"].append({"kind": "mtp"} | run_mtp(url, a, args))
            ra = {"kind": "load"} | run_load(url, a, trace, slo)
        rb = {"kind": "load"} | run_load(None, b, trace, slo)
        data["runs"] += [ra, rb]
        data |= {"a": a.name, "b": b.name, "ratios": ratios(ra, rb)}
    else:
        a, b = profiles
        if trace is None:
            ra, rb = ({"kind": "mtp"} | run_mtp(None, p, args) for p in (a, b))
        else:
            ra, rb = ({"kind": "load"} | run_load(None, p, trace, slo) for p in (a, b))
        data["runs"] += [ra, rb]
        data |= {"a": a.name, "b": b.name, "ratios": ratios(ra, rb)}


if __name__ == "__main__":
    main()
