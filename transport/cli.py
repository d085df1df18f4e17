"""The `worldcast` command.

    worldcast serve --host 127.0.0.1 --port 8000
    worldcast direct --url http://127.0.0.1:8000 --script directions.txt --out film.mp4
    worldcast worker --url ws://127.0.0.1:7880 --agent-name worldcast   # + serve's options
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.engine.device_worker import EngineConfig
from worldcast.models import registry
from worldcast.models.spec import dtype_from_name
from worldcast.sessions.manager import SessionConfig
from worldcast.transport.config import DEFAULT_STATIC_DIR, ServerConfig
from worldcast.transport.livekit import config as livekit_config


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
                        "diffusers folder or a Self-Forcing .pt with --wan-base)")
    add_model_options(s)
    s.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    s.add_argument("--ice-host", action="append", default=None, metavar="ADDR",
                   help="address to gather ICE host candidates on (repeatable; default: the bind address "
                        "if it is loopback, else every non-loopback interface)")
    s.add_argument("--video-scale", type=int, default=None,
                   help="integer upscale of the published video (default: up to ~256 px high)")
    s.add_argument("--max-batch", type=int, default=8, help="sessions per batched step (1 = no batching)")
    s.add_argument("--kv-budget-mib", type=int, default=256, help="KV pool budget, MiB")
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
                   help="seconds a session with no peer and no activity lives before it is closed")
    s.add_argument("--negotiation-timeout", type=float, default=15.0,
                   help="seconds an answered peer may take to connect before it is closed")
    s.add_argument("--ice-consent-timeout", type=float, default=None,
                   help="seconds a peer may stay silent to ICE consent checks before it is closed (default 30, "
                        "RFC 7675)")
    s.add_argument("--static-dir", type=Path, default=DEFAULT_STATIC_DIR, help="built web demo to serve at /")
    s.add_argument("--dreamverse-segment", type=float, default=5.0,
                   help="segment length of the Dreamverse-compatible endpoint WS /ws, s")
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
    return p


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


def direct(args: argparse.Namespace) -> None:
    """`worldcast direct`: bad scripts and unreachable servers are one error line."""
    import asyncio
    import sys

    import httpx

    from worldcast.transport import direct as direct_mod

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
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command in ("serve", "worker"):
        import uvicorn

        from worldcast.transport.app import create_app

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
            if args.precision is not None:
                dtype_from_name(args.precision)
        except ValueError as e:
            parser.error(str(e))
        config = ServerConfig(
            host=args.host,
            port=args.port,
            model=args.model,
            weights=args.weights,
            model_options=model_options(args),
            device=args.device,
            video_scale=args.video_scale,
            ice_host_addresses=args.ice_host or ServerConfig.default_ice_hosts(args.host),
            static_dir=args.static_dir,
            dreamverse_segment_s=args.dreamverse_segment,
            livekit=livekit,
            agent=agent,
            negotiation_timeout_s=args.negotiation_timeout,
            ice_consent_timeout_s=args.ice_consent_timeout,
            engine=EngineConfig(kv_budget_bytes=args.kv_budget_mib * 2**20, max_batch=args.max_batch,
                                torch_threads=args.threads, reserved_cores=args.reserved_cores,
                                precision=args.precision, compile_cache_dir=args.compile_cache,
                                compile_freeze=args.compile_freeze,
                                **({} if args.compile is None else {"compile": args.compile})),
            sessions=SessionConfig(
                idle_after_s=args.idle_after,
                timeout_s=args.session_timeout,
                admission=AdmissionConfig(policy=AdmissionPolicy(args.admission), max_sessions=args.max_sessions,
                                          target_utilization=args.target_utilization,
                                          max_overload_probability=args.max_overload,
                                          min_observation_s=args.min_observation),
            ),
        )
        # video is already compressed: no permessage-deflate; client messages are small (ws_stream.MAX_TEXT_BYTES)
        uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level.lower(),
                    ws_per_message_deflate=False, ws_max_size=1 << 20)


if __name__ == "__main__":
    main()
