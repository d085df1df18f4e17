"""The `worldcast` command.

    worldcast serve --host 127.0.0.1 --port 8000
    worldcast direct --url http://127.0.0.1:8000 --script directions.txt --out film.mp4
    worldcast worker --url ws://127.0.0.1:7880 --agent-name worldcast   # + serve's options
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from pathlib import Path

from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.engine.device_worker import EngineConfig
from worldcast.engine.process.client import RestartPolicy
from worldcast.models import registry
from worldcast.models.spec import dtype_from_name
from worldcast.sessions.manager import SessionConfig
from worldcast.sessions.recording import RecordingConfig
from worldcast.sessions.snapshots import SnapshotConfig
from worldcast.sessions.viewers import ViewerConfig
from worldcast.transport.config import DEFAULT_RECORDINGS_DIR, DEFAULT_SNAPSHOTS_DIR, DEFAULT_STATIC_DIR, ServerConfig
from worldcast.transport.http.conn_limits import ConnectionLimits
from worldcast.transport.http.metrics import MetricsConfig
from worldcast.transport.livekit import config as livekit_config
from worldcast.transport.memory import MemoryConfig, configure_malloc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="worldcast", description="Realtime session server for interactive world models")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the server with the embedded default model")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000,
                   help="TCP port of the HTTP API, WebSockets and demo (default 8000)")
    s.add_argument("--model", choices=registry.model_names(), default=registry.DEFAULT_MODEL, metavar="NAME[:VARIANT]",
                   help=_model_help())
    s.add_argument("--weights", type=Path, default=None,
                   help="model weights (tinyworld: a safetensors file, default the shipped one; causal-wan: a "
                        "diffusers folder, or a Self-Forcing / CausVid / LongLive .pt with --wan-base; "
                        "matrix-game-2: the release's download folder)")
    add_model_options(s)
    s.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    s.add_argument("--devices", type=_devices, default=(), metavar="DEV,DEV,...",
                   help="one engine core per device, each in its own process, e.g. cuda:0,cuda:1 (overrides "
                        "--device and --engines)")
    s.add_argument("--engines", type=int, default=1, metavar="N",
                   help="engine cores on --device (default 1); more than one run in processes of their own, "
                        "and on a CPU each takes an equal share of the cores left after --reserved-cores")
    s.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                   help="run the engine core(s) in processes of their own: crash-isolated and restarted, and the "
                        "event loop never waits for the device thread's interpreter lock (default: yes on a CPU; "
                        "on an accelerator only with more than one engine)")
    s.add_argument("--restart-backoff", type=float, default=0.5, metavar="S",
                   help="seconds before restarting a lost engine process; doubles per failed restart, up to 30")
    s.add_argument("--stall-after", type=float, default=EngineConfig.stall_after_s, metavar="S",
                   help="mark an engine stalled (no new sessions, its users get engine_stalled, /readyz fails if "
                        "no engine is left) when its device loop has not come round for S seconds; the loop comes "
                        "round after every denoising step, so this bounds one step (default %(default)s: the "
                        "longest regular step measured, a 413 ms bf16-eager CPU chunk, with room to spare)")
    s.add_argument("--stall-kill-after", type=float, default=EngineConfig.stall_kill_after_s, metavar="S",
                   help="kill a stalled engine still without progress after S seconds and restart it like a dead "
                        "one (default %(default)s: past the 2.6 s worst step measured, after a cold compile, the "
                        "worker's own 10 s step watchdog, and near the 35 s a restart takes)")
    s.add_argument("--admin-token", default=os.environ.get("WORLDCAST_ADMIN_TOKEN"), metavar="TOKEN",
                   help="bearer token of the operator routes (drain, undrain, move); default "
                        "WORLDCAST_ADMIN_TOKEN; without one they are off")
    s.add_argument("--ice-host", action="append", default=None, metavar="ADDR",
                   help="address to gather ICE host candidates on (repeatable; default: the bind address "
                        "if it is loopback, else every non-loopback interface)")
    s.add_argument("--video-scale", type=int, default=None,
                   help="integer upscale of the published video (default: up to ~256 px high)")
    s.add_argument("--max-batch", type=int, default=8, help="sessions per batched step (1 = no batching)")
    s.add_argument("--memory-fraction", type=float, default=0.8,
                   help="share of the device's free memory after the weights are loaded that every session's "
                        "declared state (KV rings, prompt and decoder caches) may take, as vLLM's "
                        "gpu_memory_utilization; on a CPU, of available RAM (default 0.8; the rest is left to "
                        "activations)")
    s.add_argument("--state-budget-mib", type=int, default=None,
                   help="a fixed state pool budget in MiB instead of --memory-fraction")
    s.add_argument("--kv-budget-mib", type=int, default=None, dest="kv_budget_mib",
                   help="the old name of --state-budget-mib (it covers all declared state, not only KV)")
    s.add_argument("--check", action="store_true",
                   help="load the model, print the memory plan (bytes per session by kind, sessions that fit, "
                        "the decode plan) and exit without serving")
    s.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads on the device worker (default: the fastest of those leaving "
                        "--reserved-cores free, measured at start-up)")
    s.add_argument("--reserved-cores", type=int, default=1,
                   help="cores left to the event loop and video encoders when choosing threads (default 1)")
    s.add_argument("--precision", default=None, metavar="DTYPE",
                   help="compute dtype, e.g. float32 or bfloat16 (default: the fastest the model declares whose "
                        "frames stay within its tolerance of float32, measured at start-up)")
    s.add_argument("--compile", dest="compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the model's steps at start-up (torch.compile; CUDA graphs on a GPU) and keep "
                        "them where measured faster than eager (default: on; WORLDCAST_COMPILE=0 turns it off)")
    s.add_argument("--compile-freeze", action="store_true",
                   help="compile with frozen weights (oneDNN prepacked: faster steps on a CPU, but not cacheable, so "
                        "every start rebuilds the graphs: minutes on a small VM)")
    s.add_argument("--compile-cache", type=Path, default=None, metavar="DIR",
                   help="where compiled steps are cached (default: $TORCHINDUCTOR_CACHE_DIR or "
                        "~/.cache/worldcast/torch-compile)")
    s.add_argument("--packages", dest="packages", action=argparse.BooleanOptionalAction, default=True,
                   help="serve compiled steps from the ahead-of-time packages `make precompile` built in the compile "
                        "cache, where checked and measured faster (default: on)")
    s.add_argument("--max-sessions", type=int, default=16, help="hard cap on open sessions")
    s.add_argument("--admission", choices=[p.value for p in AdmissionPolicy], default="duty-cycle",
                   help="admission policy (default duty-cycle)")
    s.add_argument("--target-utilization", type=float, default=0.85,
                   help="largest share of a chunk period one batched chunk may take (sets how many sessions "
                        "the device carries generating at once)")
    s.add_argument("--max-overload", type=float, default=0.05,
                   help="duty-cycle admission: largest share of time more sessions may generate than the "
                        "device carries at once")
    s.add_argument("--min-observation", type=float, default=20.0,
                   help="seconds a session is observed before admission charges its own measured duty cycle "
                        "fully (before that, partly the mean of measured sessions)")
    s.add_argument("--idle-after", type=float, default=30.0, help="seconds without actions before a session idles")
    s.add_argument("--session-timeout", type=float, default=120.0,
                   help="reconnect grace: seconds a session whose viewers all left, with no activity, lives "
                        "before it is closed")
    s.add_argument("--negotiation-timeout", type=float, default=15.0,
                   help="seconds an answered peer may take to connect before it is closed")
    s.add_argument("--ice-consent-timeout", type=float, default=None,
                   help="seconds a peer may stay silent to ICE consent checks before it is closed (default 30, "
                        "RFC 7675)")
    s.add_argument("--max-spectators", type=int, default=None, metavar="N",
                   help="live spectator streams (WHEP, read-only fMP4) on the server, at most, a WHEP player with "
                        "an encode of its own (VP8 only) counting for what it costs (default: derived from their "
                        "measured cost, a quarter of the machine's cores; docs/sharing.md)")
    s.add_argument("--max-spectators-per-session", type=int, default=ViewerConfig.max_spectators_per_session,
                   metavar="N", help="live spectator streams of one session, at most "
                                     f"(default {ViewerConfig.max_spectators_per_session})")
    s.add_argument("--viewer-ttl", type=float, default=ViewerConfig.default_ttl_s, metavar="S",
                   help=f"a viewer token's lifetime when none is asked for, s (default {ViewerConfig.default_ttl_s:g}; "
                        f"at most {ViewerConfig.max_ttl_s:g})")
    s.add_argument("--recordings-dir", type=Path, default=DEFAULT_RECORDINGS_DIR, metavar="DIR",
                   help=f"where sessions created with \"record\": true (or record_start) are recorded (default "
                        f"{DEFAULT_RECORDINGS_DIR}; docs/recordings.md)")
    s.add_argument("--no-recordings", action="store_true", help="refuse to record sessions")
    s.add_argument("--recording-max-mib", type=float, default=RecordingConfig.max_session_bytes / 2**20,
                   metavar="MIB", help="one recording's size cap; reaching it stops the recording, not the session")
    s.add_argument("--recording-quota-mib", type=float, default=RecordingConfig.max_total_bytes / 2**20,
                   metavar="MIB", help="all kept recordings together; a recording past it is refused")
    s.add_argument("--recording-retention", type=float, default=RecordingConfig.retention_s, metavar="S",
                   help="seconds a finished recording is kept after its session closed (default one day)")
    s.add_argument("--snapshots-dir", type=Path, default=DEFAULT_SNAPSHOTS_DIR, metavar="DIR",
                   help="where snapshots (POST /v1/sessions/{id}/snapshots) are kept (default "
                        f"{DEFAULT_SNAPSHOTS_DIR})")
    s.add_argument("--no-snapshots", action="store_true", help="refuse snapshots")
    s.add_argument("--max-snapshots", type=int, default=SnapshotConfig.max_snapshots, metavar="N",
                   help="snapshots kept at most; one past it is refused (delete one)")
    s.add_argument("--snapshot-quota-mib", type=float, default=SnapshotConfig.max_total_bytes / 2**20, metavar="MIB",
                   help="snapshots' bytes at most; one past it is refused")
    s.add_argument("--retake-mib", type=float, default=SessionConfig.retake_max_bytes / 2**20, metavar="MIB",
                   help="a directing session's kept segment starts (\"take it again from segment N\"), MiB of "
                        f"captured state at most (default {SessionConfig.retake_max_bytes / 2**20:g}; 0: no retakes)")
    s.add_argument("--static-dir", type=Path, default=DEFAULT_STATIC_DIR, help="built web demo to serve at /")
    s.add_argument("--dreamverse-segment", type=float, default=5.0,
                   help="segment length of the Dreamverse-compatible endpoint WS /ws, s")
    s.add_argument("--dreamverse-segment-cap", type=int, default=6, metavar="N",
                   help="segments per Dreamverse rollout before ltx2_stream_complete (0: no cap)")
    s.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on a separate listener on this port (GET /metrics on the API "
                        "port carries only aggregate series, never session ids)")
    s.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDR",
                   help="bind address of the metrics listener (default 127.0.0.1: keep it internal)")
    s.add_argument("--metrics-per-session", action="store_true",
                   help="also export per-session series (session ids as labels) on the metrics listener")
    s.add_argument("--metrics-max-sessions", type=int, default=64, metavar="N",
                   help="per-session series for at most this many sessions, the newest (default 64)")
    s.add_argument("--connect-grace", type=float, default=15.0, metavar="S",
                   help="seconds a new session may go without a connected viewer before it is closed, freeing "
                        "its slot (a WebRTC peer still negotiating holds it until --negotiation-timeout)")
    s.add_argument("--head-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a client has to send a request's head (request line and headers) before it "
                        "gets 408 and is closed (default 10; 0: off)")
    s.add_argument("--max-connections-per-client", type=int, default=64, metavar="N",
                   help="open connections one remote address may hold, HTTP and WebSocket (default 64; 0: no "
                        "limit; behind a reverse proxy every client shares its address)")
    s.add_argument("--malloc-arena-max", type=int, default=2, metavar="N",
                   help="cap glibc's malloc arenas (as MALLOC_ARENA_MAX; default 2, 0: glibc's default of 8 per "
                        "core): fewer arenas hold less freed memory after peaks")
    s.add_argument("--malloc-mmap-threshold", type=int, default=1 << 20, metavar="BYTES",
                   help="allocations this large are mmapped and given back on free (default 1 MiB; 0: glibc's "
                        "dynamic threshold)")
    s.add_argument("--no-heap-trim", action="store_true",
                   help="do not return freed heap to the OS (malloc_trim) after sessions close")
    s.add_argument("--log-level", default="info")
    livekit_config.add_arguments(s)
    w = sub.add_parser("worker", parents=[s], conflict_handler="resolve",
                       help="serve (as `serve` does) and register with LiveKit as an agent worker for explicit "
                            "dispatch: LiveKit places rooms on workers by the load each reports")
    w.add_argument("--url", default=None, help="LiveKit server (default: --livekit-url, LIVEKIT_URL)")
    w.add_argument("--agent-name", default="worldcast", help="the agent name dispatches ask for")
    d = sub.add_parser("direct", help="play timed directions against a server and write the film to an MP4 file",
                       description="Each script line is 'AT_S PROMPT' (seconds from the start) or JSON "
                                   '{"at_s", "prompt", "duration_s"?}; from stdin a line may omit AT_S '
                                   "(sent when read). A direction during a segment cuts it.")
    d.add_argument("--url", default="http://127.0.0.1:8000", help="the worldcast server")
    d.add_argument("--script", default="-", help="file of timed directions, or - to read them from stdin")
    d.add_argument("--out", type=Path, required=True, help="the film, an MP4 file")
    d.add_argument("--seed", type=int, default=None, help="seed of the world")
    d.add_argument("--fragmented", action="store_true", help="write the stream's fragmented MP4 as received")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    r = sub.add_parser("replay", help="generate a recorded session again from its event log, frame for frame",
                       description="Reads a log recorded with \"record\": true (GET /v1/sessions/{id}/recording/"
                                   "events, or events.jsonl in the recordings directory, with its images/ and "
                                   "snapshot.bin beside it), generates every frame again on the recorded model, "
                                   "weights and served way, each forward at its recorded batch size and row, "
                                   "and checks each against the recorded one (docs/recordings.md). A log is "
                                   "trusted with nothing: it opens no file outside its own folder and every value "
                                   "is checked before the model sees it. Exit status 0: every frame identical; "
                                   "1: some differ (listed), or an internal error (its traceback with --debug); "
                                   "2: the log is refused, or replay failed (one line says what).")
    r.add_argument("events", type=Path, help="the event log (events.jsonl)")
    r.add_argument("--out", type=Path, default=None, help="write the delivered frames as an MP4 film")
    r.add_argument("--frames", type=Path, default=None, metavar="DIR", help="write every frame as a PNG here")
    r.add_argument("--export", type=Path, default=None, metavar="DIR",
                   help="write frames.npy, actions.npy and index.npy here (training, analysis)")
    r.add_argument("--weights", type=Path, default=None,
                   help="the weights (default: the model's shipped weights; the path the log names is never "
                        "opened); checked against the log's sha256")
    r.add_argument("--snapshot", type=Path, default=None, metavar="FILE",
                   help="the state of the snapshot the session started from (default: snapshot.bin beside the log)")
    r.add_argument("--device", default="cpu", help="torch device (default cpu)")
    r.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    r.add_argument("--log-level", default="warning")
    r.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    return p


def replay_command(args: argparse.Namespace) -> int:
    """`worldcast replay`: see its parser's description."""
    import sys

    from worldcast.engine.step_output import FrameOut
    from worldcast.sessions.recording import RecordingError, read_events
    from worldcast.sessions.replay import replay
    from worldcast.transport.media.h264 import FilmWriter

    film: FilmWriter | None = None
    try:
        events = read_events(args.events)
        fps = events[0].fields.get("fps") or 20
        if not (isinstance(fps, int | float) and not isinstance(fps, bool) and 1 <= fps <= 1000):
            raise RecordingError(f"events.jsonl line 1: fps must be a number 1..1000, got {str(fps)[:40]}")
        delivered = {e.fields["index"] for e in events if e.type == "frame" and e.fields["outcome"] == "delivered"}
        del events

        def keep(f: FrameOut) -> None:
            nonlocal film
            if args.out is not None and f.frame_index in delivered:
                try:
                    if film is None:
                        film = FilmWriter(args.out, fps=fps)
                    film.add(f.image)
                except OSError as e:  # PyAV's errors may not name the file
                    raise OSError(e.errno, e.strerror or str(e), str(args.out)) from None

        report = replay(args.events, weights=args.weights, device=args.device, snapshot=args.snapshot,
                        threads=args.threads,
                        frames_dir=args.frames, export_dir=args.export, on_frame=keep)
        if film is not None:
            film.close()
    except RecordingError as e:
        print(f"worldcast replay: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the log, --snapshot, or writing --out, --frames, --export
        print(f"worldcast replay: {e.filename or 'a file'}: {e.strerror or e}", file=sys.stderr)  # (one line)
        return 2
    except Exception as e:  # noqa: BLE001 - one line, not a traceback (unless asked for)
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"worldcast replay: internal error: {type(e).__name__}: {str(e)[:300]}"
              + ("" if args.debug else " (--debug prints its traceback)"), file=sys.stderr)
        return 1
    finally:
        if film is not None:
            with contextlib.suppress(Exception):
                film.close()
    for d in report.differences:
        print(f"differs from the recording: {d}")
    if film is not None:
        print(f"film: {args.out} ({film.frames} frames at {film.fps:g} frames/s)")
    print(f"replayed {report.chunks} chunks ({report.dropped_draws} dropped draws), {report.frames} frames: "
          f"{report.identical} identical to the recording" + (
              f", {len(report.unverified)} never reached the server (nothing to compare)" if report.unverified
              else "") + (
              "" if report.exact else f", {len(report.mismatched)} differ (first {report.mismatched[:10]})"))
    if report.psnr_db:
        values = [v for _, v in report.psnr_db]
        finite = [v for v in values if v != float("inf")]
        print(f"PSNR of the {len(values)} differing frames against the recording's video (lossy H.264): "
              f"min {min(values):.1f} dB, mean {sum(finite) / len(finite) if finite else float('inf'):.1f} dB")
    return 0 if report.exact else 1


def _devices(text: str) -> tuple[str, ...]:
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    if not devices:
        raise argparse.ArgumentTypeError("give one or more devices, e.g. cuda:0,cuda:1")
    return devices


def _model_help() -> str:
    lines = [f"{f.name}:{v.name}{' (= ' + f.name + ')' if v.name == f.default_variant else ''}: {v.description}"
             for f in registry.families() for v in f.variants]
    return "the world model, NAME[:VARIANT] from the registry (default %(default)s; GET /v1/models lists them): " + \
        "; ".join(lines)


_OPTION_TYPES = {"str": str, "path": Path, "int": int, "float": float}


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Every registered family's own options as `--NAME` flags (default None: the family's default applies)."""
    seen: set[str] = set()
    for fam in registry.families():
        for o in fam.options:
            if o.name in seen:
                continue
            seen.add(o.name)
            default = f" (default {o.default})" if o.default not in (None, False) else ""
            if o.type == "flag":
                p.add_argument(f"--{o.name}", action="store_true", default=None, help=f"{o.help}{default}")
            else:
                p.add_argument(f"--{o.name}", type=_OPTION_TYPES[o.type], choices=o.choices, default=None,
                               help=f"{o.help}{default}")


def model_options(args: argparse.Namespace) -> dict[str, object]:
    """The family options given on the command line, by key (not given: absent)."""
    keys = {o.key for fam in registry.families() for o in fam.options}
    return {k: getattr(args, k) for k in sorted(keys) if getattr(args, k, None) is not None}


def state_budget_bytes(args: argparse.Namespace) -> int | None:
    """--state-budget-mib (or its old name --kv-budget-mib, which says so) in bytes; None: from memory."""
    if args.kv_budget_mib is not None:
        logging.getLogger("worldcast").warning("--kv-budget-mib is the old name of --state-budget-mib (the budget "
                                               "covers every kind of declared state); use --state-budget-mib")
        if args.state_budget_mib is None:
            return args.kv_budget_mib * 2**20
    return args.state_budget_mib * 2**20 if args.state_budget_mib is not None else None


def check(config: ServerConfig) -> int:
    """`serve --check`: load the model, print its memory plan, serve nothing. Returns the exit status."""
    from worldcast.engine.device_worker import plan_engine_memory
    from worldcast.engine.errors import DeviceTooSmall
    from worldcast.engine.memory import fmt_bytes

    model = config.load_model()
    spec = model.spec
    print(f"model: {spec.name} ({getattr(model, 'source', '') or 'loaded'}) on {config.device}, "
          f"{spec.frame_height}x{spec.frame_width} at {spec.fps} fps, {spec.denoising_steps} denoising steps")
    try:
        plan = plan_engine_memory(model, config.engine)
    except DeviceTooSmall as e:
        print(f"REFUSED: {e}")
        return 2
    print(plan.describe())
    if plan.headroom_bytes is not None:
        line = model.plan_activation_memory(available_bytes=max(0, plan.headroom_bytes),
                                            max_batch=min(config.engine.max_batch, plan.num_slots))
        if line:
            print(line)
    for name, b in plan.by_kind.items():
        names = plan.names_by_kind[name]
        more = ", ..." if len(names) > 3 else ""
        print(f"  {name:<18} {fmt_bytes(b):>10} per session  ({', '.join(names[:3])}{more})")
    print(f"sessions that fit: {plan.fit_slots} (pool holds {plan.num_slots}); check passed")
    return 0


def direct(args: argparse.Namespace) -> None:
    """`worldcast direct`: bad scripts and unreachable servers are one error line."""
    import asyncio
    import sys

    import httpx

    from worldcast.transport.clients import direct as direct_mod

    try:
        if args.script == "-":
            directions, total = direct_mod.stdin_directions(sys.stdin), None
        else:
            with open(args.script, encoding="utf-8") as f:
                script = direct_mod.parse_script(f)
            directions, total = direct_mod.listed(script), direct_mod.plan_length_s(script)
        reports = asyncio.run(direct_mod.run_direct(args.url, directions, out=args.out, seed=args.seed,
                                                    fragmented=args.fragmented, total_s=total,
                                                    progress=not args.no_progress))
    except (OSError, ValueError) as e:
        raise SystemExit(f"worldcast direct: {e}") from None
    except httpx.HTTPError as e:
        raise SystemExit(f"worldcast direct: {args.url}: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    cut = sum(r.end == "cut" for r in reports)
    print(f"film: {args.out} ({sum(r.frames for r in reports)} frames, {len(reports)} segments, {cut} cut)")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "direct":
        direct(args)
        return
    if args.command == "replay":
        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        raise SystemExit(replay_command(args))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command in ("serve", "worker"):
        try:  # first: before any thread allocates (the app repeats it, harmlessly)
            configure_malloc(memory_config_from(args))
        except ValueError as e:
            parser.error(str(e))
        import uvicorn

        from worldcast.transport.http.app import create_app
        from worldcast.transport.http.conn_limits import serve_config

        agent = None
        try:
            if args.command == "worker":
                args.livekit_url = args.url or args.livekit_url
                agent = livekit_config.AgentWorkerConfig(agent_name=args.agent_name)
            livekit = livekit_config.from_arguments(args)
            if agent is not None and livekit is None:
                raise ValueError("worker: give --url (or LIVEKIT_URL), with --livekit-api-key and "
                                 "--livekit-api-secret (or LIVEKIT_API_KEY and LIVEKIT_API_SECRET)")
        except ValueError as e:
            parser.error(str(e))
        try:
            registry.check_request(args.model, weights=args.weights, options=model_options(args))
            if args.engines < 1:
                raise ValueError("--engines must be >= 1")
            if args.devices and args.engines != 1 and args.engines != len(args.devices):
                raise ValueError(f"--engines {args.engines} disagrees with the {len(args.devices)} --devices given")
            if not args.restart_backoff > 0:
                raise ValueError("--restart-backoff must be positive")
            if args.precision is not None:
                dtype_from_name(args.precision)
            config = _server_config(args, livekit, agent)
        except ValueError as e:
            parser.error(str(e))
        if args.check:
            try:
                raise SystemExit(check(config))
            except (OSError, ValueError) as e:  # missing or malformed weights, no preset: one line
                raise SystemExit(f"worldcast serve --check: {e}") from None
        server = uvicorn.Server(serve_config(create_app(config), host=args.host, port=args.port,
                                             limits=config.connections, log_level=args.log_level.lower()))
        server.run()


def memory_config_from(args: argparse.Namespace) -> MemoryConfig:
    """`MemoryConfig` from `serve`'s options (0 turns a malloc setting off: glibc's default)."""
    return MemoryConfig(malloc_arena_max=args.malloc_arena_max or None,
                        mmap_threshold_bytes=args.malloc_mmap_threshold or None,
                        trim_after_close_s=None if args.no_heap_trim else 2.0)


def engine_processes(args: argparse.Namespace) -> bool | None:
    """`--engine-process` as given; when not given, True if every engine is on a CPU, else None (the server's
    own default: in processes of their own only when there are several).

    On a CPU an engine in the server's process shares the interpreter lock with the event loop, which
    then takes actions off the data channel, and sends frames, only between the device thread's steps
    (an ahead-of-time package holds the lock for a whole step: `python -m worldcast.latency_bench.engine_bench --gil`).
    Served motion-to-photon over WebRTC measured p50 / p95 28.5-32.9 / 43-57 ms with the engine in its
    own process against 30-44 / 51-73 ms in the server's (BENCHMARKS.md, "An AMD EPYC with AVX-512 and
    bf16 dot products"). On an accelerator the engine stays in the server's process by default: a
    process of its own means a second copy of the model on the host for encoding actions and prompts.
    """
    if args.engine_process is not None:
        return bool(args.engine_process)
    devices = args.devices or (args.device,)
    return True if all(str(d).strip().split(":")[0] == "cpu" for d in devices) else None


def _server_config(args: argparse.Namespace, livekit: livekit_config.LiveKitConfig | None,
                   agent: livekit_config.AgentWorkerConfig | None) -> ServerConfig:
    """`serve`'s arguments as a ServerConfig.

    Raises:
        ValueError: a setting out of range (the message names it).
    """
    return ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        weights=args.weights,
        model_options=model_options(args),
        device=args.device,
        video_scale=args.video_scale,
        ice_host_addresses=args.ice_host or ServerConfig.default_ice_hosts(args.host),
        static_dir=args.static_dir,
        dreamverse_segment_s=args.dreamverse_segment, dreamverse_segment_cap=args.dreamverse_segment_cap,
        livekit=livekit,
        agent=agent,
        negotiation_timeout_s=args.negotiation_timeout,
        ice_consent_timeout_s=args.ice_consent_timeout,
        memory=memory_config_from(args),
        connections=ConnectionLimits(head_timeout_s=args.head_timeout,
                                     max_per_client=args.max_connections_per_client),
        recordings=None if args.no_recordings else RecordingConfig(
            args.recordings_dir, max_session_bytes=int(args.recording_max_mib * 2**20),
            max_total_bytes=int(args.recording_quota_mib * 2**20), retention_s=args.recording_retention),
        snapshots=None if args.no_snapshots else SnapshotConfig(
            args.snapshots_dir, max_snapshots=args.max_snapshots,
            max_total_bytes=int(args.snapshot_quota_mib * 2**20)),
        viewers=ViewerConfig(max_spectators=args.max_spectators,
                             max_spectators_per_session=args.max_spectators_per_session,
                             default_ttl_s=args.viewer_ttl),
        metrics=MetricsConfig(port=args.metrics_port, host=args.metrics_host,
                              per_session=args.metrics_per_session, max_sessions=args.metrics_max_sessions),
        engine=EngineConfig(state_budget_bytes=state_budget_bytes(args), memory_fraction=args.memory_fraction,
                            max_slots=args.max_sessions, max_batch=args.max_batch,
                            torch_threads=args.threads, reserved_cores=args.reserved_cores,
                            precision=args.precision, compile_cache_dir=args.compile_cache,
                            compile_freeze=args.compile_freeze, use_packages=args.packages,
                            stall_after_s=args.stall_after, stall_kill_after_s=args.stall_kill_after,
                            **({} if args.compile is None else {"compile": args.compile})),
        engines=args.engines,
        devices=args.devices,
        engine_processes=engine_processes(args),
        restart=RestartPolicy(initial_backoff_s=args.restart_backoff,
                              max_backoff_s=max(30.0, args.restart_backoff)),
        admin_token=args.admin_token,
        sessions=SessionConfig(
            idle_after_s=args.idle_after,
            timeout_s=args.session_timeout,
            connect_grace_s=args.connect_grace,
            retake_max_bytes=int(args.retake_mib * 2**20),
            admission=AdmissionConfig(policy=AdmissionPolicy(args.admission), max_sessions=args.max_sessions,
                                      target_utilization=args.target_utilization,
                                      max_overload_probability=args.max_overload,
                                      min_observation_s=args.min_observation),
        ),
    )


if __name__ == "__main__":
    main()
