"""`spectators`: what spectators of one session cost its controller and the server, in one run on one server.

    python -m worldcast.latency_bench spectators --seconds 15 --counts 0,1,4,16 --kinds fmp4,whep

One `worldcast serve` in a child process (loopback, `latency_bench/server.py`), one controller session
(stamped frames, `transport/media/stamp.py`) sending actions at `--action-hz` throughout, over the worldcast
stream (fMP4; `--controller webrtc`: aiortc). Phases follow one another, each `--seconds` long: no
spectators, then for each kind `--counts` spectators watching with one viewer token (kept open as the count
grows, closed before the next kind), then no spectators again (the drift of the machine over the run). Kinds:

- `fmp4`: read-only worldcast streams (`StreamClient.attach` with the viewer token, `decode=False`: the
  benchmark keeps each media event's arrival and reads no pictures, so it takes little of the machine);
- `whep`: WHEP players (`transport/clients/whep.py`, aiortc, H.264 offered: the session's one encode),
  which decode every picture (aiortc's receiver always does) and read the stamp from it;
- `whep-vp8`: WHEP players offering only VP8 (an encode each on the server).

Per phase: the controller's motion-to-photon (from sending an action to the first decoded frame whose stamp
covers it, `probe.measure`) and frames/s; the server's CPU over the phase from /proc/<pid>/stat deltas
(utime + stime), split into the server process (the network edge, the encode, the spectators' sinks) and
its engine processes, in cores (CPU-seconds per second); the spectators' delay behind the controller: for
each frame both received, the spectator's arrival time minus the controller's (fMP4: media segment arrival
on both sides; WHEP: the spectator's decoded picture against the controller's first sight of that frame,
decoded for WebRTC, the segment's arrival for fMP4), pooled over spectators; and the share of the
controller's frames each spectator got. Linux only (/proc). Numbers go to report.json in --out; nothing is
asserted (BENCHMARKS.md records them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiortc.mediastreams import MediaStreamError

from worldcast.latency_bench import stats
from worldcast.latency_bench.fmp4 import StreamProbe
from worldcast.latency_bench.probe import SessionProbe, model_fps
from worldcast.latency_bench.server import ServerProfile, serve_process
from worldcast.sessions.viewers import own_encode_weight
from worldcast.transport.clients.stream import StreamClient
from worldcast.transport.clients.whep import WhepPlayer
from worldcast.transport.media.stamp import cell_px_for_width, read_stamp

KINDS = ("fmp4", "whep", "whep-vp8")
#: Seconds after the spectators of a phase are open (each has had a frame) before it is measured: their
#: first IDR, the ICE and DTLS handshakes of WHEP players, the encode's first frames for a new picture.
SETTLE_S = 1.5
#: Longest wait for one spectator's first frame, s.
FIRST_FRAME_TIMEOUT_S = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# -- CPU of a process tree from /proc ------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime + stime in clock ticks) of `pid`, None if it is gone (proc(5): fields 4, 14, 15)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(rest[1]), int(rest[11]) + int(rest[12])


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children, their children...), from one scan of /proc."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (s := _stat(int(name))) is not None:
            parent[int(name)] = s[0]
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def server_pid(url: str) -> int:
    """The pid of this process's child serving `url` (serve_process's `worldcast serve`).

    Raises:
        RuntimeError: no child of this process has the port in its command line.
    """
    port = url.rsplit(":", 1)[1]
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and port.encode() in argv:
            return pid
    raise RuntimeError(f"no child process serves {url}")


@dataclass
class CpuSample:
    """CPU used so far by the server process and by its descendants (engine processes), s; at `wall_s`."""

    wall_s: float
    server_s: float
    engines_s: float
    bench_s: float

    @classmethod
    def take(cls, pid: int) -> CpuSample:
        own = _stat(pid)
        kids = [s[1] for k in descendants(pid) if (s := _stat(k)) is not None]
        t = os.times()
        return cls(time.monotonic(), (own[1] if own else 0) / CLK_TCK, sum(kids) / CLK_TCK, t.user + t.system)

    def cores_since(self, before: CpuSample) -> dict[str, float]:
        """CPU-seconds per second (cores) of each part between `before` and this sample."""
        dt = self.wall_s - before.wall_s
        return {k: round((getattr(self, k + "_s") - getattr(before, k + "_s")) / dt, 3)
                for k in ("server", "engines", "bench")}


# -- spectators ----------------------------------------------------------------------------------


@dataclass
class Spectator:
    """One spectator of the benchmark; `received()` is what it got, as (frame index, arrival s) pairs."""

    kind: str
    pictures: list[tuple[int, float]] = field(default_factory=list)  #: WHEP: stamped index, decoded at (s)
    stream: StreamClient | None = None
    player: WhepPlayer | None = None
    task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, kind: str, url: str, session_id: str, viewer: dict[str, Any]) -> Spectator:
        sp = cls(kind)
        if kind == "fmp4":
            sp.stream = await StreamClient.attach(url, session_id, viewer["viewer_token"], decode=False)
        else:
            sp.player = await WhepPlayer.play(viewer["whep_url"], viewer["viewer_token"],
                                              vp8_only=kind == "whep-vp8")
            sp.task = asyncio.create_task(sp._read_pictures(), name="spectator-whep")
        return sp

    async def _read_pictures(self) -> None:
        assert self.player is not None
        while True:
            try:
                f = await self.player.next_frame(timeout_s=3600)
            except MediaStreamError:  # the peer closed (the benchmark's close, or the server's)
                return
            now = time.monotonic()
            luma = f.to_ndarray(format="gray")
            s = read_stamp(luma, cell_px=cell_px_for_width(luma.shape[1]))
            if s is not None:
                self.pictures.append((s.frame_index, now))

    def received(self) -> list[tuple[int, float]]:
        """(frame index, client monotonic arrival s) of every frame received so far (fMP4: the stream's media
        events, kept by the client with their arrival; WHEP: decoded pictures whose stamp read)."""
        if self.stream is not None:
            return [(e["frame_index"], e["received_s"]) for e in list(self.stream.events) if e["event"] == "media"]
        return list(self.pictures)

    async def first_frame(self, timeout_s: float = FIRST_FRAME_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.received():
            if time.monotonic() > deadline or (self.task is not None and self.task.done()):
                raise TimeoutError(f"a {self.kind} spectator had no frame within {timeout_s:g} s")
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=2.0)
        with contextlib.suppress(Exception):
            if self.stream is not None:
                await asyncio.wait_for(self.stream.aclose(delete=False), 5.0)
            if self.player is not None:
                await asyncio.wait_for(self.player.close(), 10.0)


# -- the run ----------------------------------------------------------------------------------------


def _summary(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    q = stats.percentiles(xs)
    return {"n": len(xs), "p50": round(q["p50"], 1), "p95": round(q["p95"], 1), "max": round(max(xs), 1)}


def _controller_seen(controller: SessionProbe) -> dict[int, float]:
    """Frame index -> when the controller first had it (fMP4: the media event's arrival; WebRTC: the decoded
    picture whose stamp read)."""
    seen: dict[int, float] = {}
    if isinstance(controller, StreamProbe):
        pairs = [(e["frame_index"], e["received_s"]) for e in list(controller.stream.events)
                 if e["event"] == "media"]
    else:
        pairs = [(f.frame_index, f.arrival_s) for f in controller.frames if f.frame_index is not None]
    for i, t in pairs:
        seen.setdefault(i, t)
    return seen


def _controller_decoded(controller: SessionProbe) -> dict[int, float]:
    seen: dict[int, float] = {}
    for f in controller.frames:
        if f.frame_index is not None:
            seen.setdefault(f.frame_index, f.arrival_s)
    return seen


def spectator_delays(controller: SessionProbe, spectators: list[Spectator], window: tuple[float, float]
                     ) -> dict[str, Any]:
    """Delay behind the controller (ms, pooled) and the share of the controller's frames each got, over
    the controller's frames that arrived inside `window`."""
    if not spectators:
        return {}
    a, b = window
    ctrl = _controller_seen(controller)
    decoded = _controller_decoded(controller)
    in_window = {i for i, t in ctrl.items() if a <= t < b}
    delays: list[float] = []
    shares: list[float] = []
    for sp in spectators:
        got: dict[int, float] = {}
        for i, t in sp.received():
            got.setdefault(i, t)
        # like for like: fMP4 arrival against the controller's arrival; WHEP's decoded picture against the
        # controller's decoded picture when it decodes (both probes do)
        ref = ctrl if sp.kind == "fmp4" else (decoded or ctrl)
        delays += [(got[i] - ref[i]) * 1e3 for i in in_window if i in got and i in ref]
        shares.append(len(in_window & got.keys()) / len(in_window) if in_window else float("nan"))
    return {"delay_behind_controller_ms": _summary(delays),
            "frames_share_min": round(min(shares), 3), "frames_share_mean": round(statistics.fmean(shares), 3)}


def cap_flags(counts: list[int], kinds: list[str]) -> list[str]:
    """`worldcast serve` flags whose spectator caps admit every phase's spectators and no more.

    The session's cap counts streams; the server's counts each by its weight, so a VP8-only WHEP player
    (an encode of its own) counts `own_encode_weight()` (`sessions/viewers.py`).
    """
    most = max(max(counts), 1)
    weight = own_encode_weight() if "whep-vp8" in kinds else 1
    return ["--max-spectators-per-session", str(most), "--max-spectators", str(most * weight)]


async def _viewer(url: str, session_id: str, token: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post(f"/v1/sessions/{session_id}/viewers", headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()
        return dict(r.json())


async def run(url: str, *, pid: int, counts: list[int], kinds: list[str], seconds: float, action_hz: float,
              controller_transport: str = "fmp4") -> dict[str, Any]:
    """The phases against `url` (served by process `pid`); returns the report (`main` writes it)."""
    fps = await model_fps(url)
    controller: SessionProbe
    if controller_transport == "fmp4":
        controller = await StreamProbe.open(url, seed=0)
        token = controller.stream.token
    else:
        controller = await SessionProbe.open(url, seed=0)
        token = controller.client.token
    phases: list[dict[str, Any]] = []
    spectators: list[Spectator] = []
    try:
        await controller.first_frame(FIRST_FRAME_TIMEOUT_S)
        sid = controller.client.session_id
        viewer = await _viewer(url, sid, token)
        await controller.act_for(2.0, action_hz)  # the controller's first actions, unmeasured

        async def phase(kind: str, n: int) -> None:
            while len(spectators) < n:  # open the phase's new spectators together
                more = await asyncio.gather(*(Spectator.open(kind, url, sid, viewer)
                                              for _ in range(n - len(spectators))))
                spectators.extend(more)
            await asyncio.gather(*(sp.first_frame() for sp in spectators))
            await controller.act_for(SETTLE_S, action_hz)
            before = CpuSample.take(pid)
            t0 = time.monotonic()
            await controller.act_for(seconds, action_hz)
            t1 = time.monotonic()
            cpu = CpuSample.take(pid).cores_since(before)
            await asyncio.sleep(0.5)  # the window's last frames reach everyone (they count only if sent inside)
            m = controller.measure([(t0, t1)], frame_period_s=1.0 / fps)
            row = {"kind": kind if n else "none", "spectators": n, "seconds": round(t1 - t0, 2),
                   "controller_mtp_ms": {k: round(v, 1) for k, v in stats.percentiles(m.mtp_ms).items()},
                   "controller_fps": round(m.fps, 2), "cpu_cores": cpu,
                   "cpu_cores_server_and_engines": round(cpu["server"] + cpu["engines"], 3)}
            row |= spectator_delays(controller, spectators, (t0, t1))
            phases.append(row)
            print(json.dumps(row), flush=True)

        if 0 in counts:
            await phase("none", 0)
        for kind in kinds:
            for n in sorted(c for c in counts if c > 0):
                await phase(kind, n)
            await asyncio.gather(*(sp.close() for sp in spectators))
            spectators.clear()
        if 0 in counts:
            await phase("none", 0)  # again: how far the machine drifted over the run
    finally:
        await asyncio.gather(*(sp.close() for sp in spectators))
        await controller.close()
    base = [p for p in phases if p["spectators"] == 0]
    base_cpu = statistics.fmean(p["cpu_cores"]["server"] for p in base) if base else float("nan")
    for p in phases:  # the server process's CPU each spectator added over the phases without any
        if p["spectators"]:
            p["server_cpu_per_spectator_cores"] = round((p["cpu_cores"]["server"] - base_cpu) / p["spectators"], 4)
    return {"controller": controller_transport, "fps": fps, "action_hz": action_hz, "phases": phases}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.spectators", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="0,1,4,16", help="spectators per phase, comma separated (0: none)")
    ap.add_argument("--kinds", default="fmp4,whep", help=f"spectator kinds, comma separated, of {', '.join(KINDS)}")
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per phase")
    ap.add_argument("--action-hz", type=float, default=4.0, help="the controller's actions per second")
    ap.add_argument("--controller", choices=["fmp4", "webrtc"], default="fmp4",
                    help="how the controller watches and acts (fmp4: its stream shares the spectators' encode)")
    ap.add_argument("--profile", default="static", help="server profile (latency_bench/server.py)")
    ap.add_argument("--out", type=Path, default=Path("bench_results") / time.strftime("spectators-%Y%m%d-%H%M%S"))
    args = ap.parse_args(argv)
    try:
        counts = [int(x) for x in args.counts.split(",") if x.strip()]
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        profile = ServerProfile.parse(args.profile)
        if not counts or not all(0 <= c <= 64 for c in counts):
            raise ValueError("--counts: 0 to 64 spectators each")
        if not kinds or not set(kinds) <= set(KINDS):
            raise ValueError(f"--kinds: of {', '.join(KINDS)}")
        if not (0 < args.seconds <= 600 and 0 < args.action_hz <= 100):
            raise ValueError("need 0 < --seconds <= 600 and 0 < --action-hz <= 100")
        if not os.path.isdir("/proc/self"):
            raise ValueError("the CPU measurement reads /proc (Linux)")
    except ValueError as e:
        ap.error(str(e))
    flags = [*profile.flags(), *cap_flags(counts, kinds)]
    out: dict[str, Any] = {"command": "spectators", "machine": platform.platform(),
                           "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                           "server_flags": flags, "seconds": args.seconds}
    with serve_process(flags, name="spectators") as url:
        pid = server_pid(url)
        out |= asyncio.run(run(url, pid=pid, counts=counts, kinds=kinds, seconds=args.seconds,
                               action_hz=args.action_hz, controller_transport=args.controller))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(out, indent=2))
    print(table(out["phases"]))
    print(f"report: {args.out / 'report.json'}")


def table(phases: list[dict[str, Any]]) -> str:
    """The phases as a Markdown table (as BENCHMARKS.md records them)."""
    rows = ["| spectators | controller mtp p50 / p95 ms | controller fps | server process cores | engine cores "
            "| per spectator cores | delay behind controller p50 / p95 ms | frames got (min) |",
            "|---|---|---|---|---|---|---|---|"]
    for p in phases:
        d = p.get("delay_behind_controller_ms", {})
        rows.append(f"| {p['spectators']} {p['kind'] if p['spectators'] else ''} "
                    f"| {p['controller_mtp_ms'].get('p50', float('nan')):.0f} / "
                    f"{p['controller_mtp_ms'].get('p95', float('nan')):.0f} | {p['controller_fps']:.1f} "
                    f"| {p['cpu_cores']['server']:.2f} | {p['cpu_cores']['engines']:.2f} "
                    f"| {p.get('server_cpu_per_spectator_cores', float('nan')):.3f} "
                    f"| {d.get('p50', float('nan')):.0f} / {d.get('p95', float('nan')):.0f} "
                    f"| {p.get('frames_share_min', float('nan')):.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
