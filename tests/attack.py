"""The hostile run of issue 22, replayed from outside against `worldcast serve` with README's flags.

    python -m tests.attack [--out attack.json] [--skip rss,flood]

Starts `worldcast serve` in a child process the way README says (no `--video-scale`; static admission
with 8 sessions, as the hostile run had), with a local livekit-server when it is built, and a second
server whose LiveKit is unreachable; then runs every case of the issue with bounded loops, as a client
with no privileges would (HTTP, WebSockets, raw sockets, aiortc peers, the LiveKit SDK), and prints one
table: case, what must hold, what was observed. Exit status 0 when every case holds. Cases needing
livekit-server are reported as skipped without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from worldcast.latency_bench.server import serve_process

#: README's defaults that bound the waits below, s.
CONNECT_GRACE_S, NEGOTIATION_S, HEAD_TIMEOUT_S, INIT_TIMEOUT_S, FLOOD_SUSTAINED_S = 15.0, 15.0, 10.0, 10.0, 5.0
#: The LiveKit user token TTL the attacked server runs with (the shortest allowed), s.
TOKEN_TTL_S = 10.0


@dataclass
class Case:
    name: str
    must: str
    observed: str = ""
    ok: bool | None = None  #: None: skipped


@dataclass
class Report:
    cases: list[Case] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.cases)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(*flags: str) -> Iterator[tuple[str, int]]:
    """`worldcast serve` with README's flags plus `flags`, in a child process; yields (URL, metrics port)."""
    mport = _free_port()
    with serve_process(["--admission", "static", "--max-sessions", "8", "--metrics-port", str(mport), *flags],
                       name="attack", ready_timeout_s=180) as url:
        yield url, mport


def ws(url: str, path: str) -> str:
    return "ws" + url.removeprefix("http") + path


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await http.post("/v1/sessions", json=body)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


async def delete_all(http: httpx.AsyncClient, made: list[dict[str, Any]]) -> None:
    for s in made:
        await http.delete(f"/v1/sessions/{s['session_id']}", headers={"Authorization": f"Bearer {s['token']}"})


async def offer_never_applied(http: httpx.AsyncClient, s: dict[str, Any]) -> int:
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("actions")
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    r = await http.post(f"/v1/sessions/{s['session_id']}/webrtc", headers={"Authorization": f"Bearer {s['token']}"},
                        json={"sdp": pc.localDescription.sdp, "type": "offer"})
    await pc.close()
    return r.status_code


# -- the cases ------------------------------------------------------------------------------------------------


async def case_capacity(url: str) -> Case:
    c = Case("capacity: 8 silent /ws sockets + 8 offers never connected",
             "a new session is admitted <= 25 s later; Retry-After no earlier than the slot frees")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        silent = [await connect(ws(url, "/ws"), compression=None) for _ in range(8)]
        made = [await create(http) for _ in range(8)]
        codes = [await offer_never_applied(http, s) for s in made]
        t0 = time.monotonic()
        r = await http.post("/v1/sessions", json={})
        retry = float(r.headers.get("Retry-After", "nan"))
        admitted_at = None
        while time.monotonic() - t0 < 30:
            r2 = await http.post("/v1/sessions", json={})
            if r2.status_code == 201:
                admitted_at = time.monotonic() - t0
                await delete_all(http, [r2.json()])
                break
            await asyncio.sleep(0.5)
        for w in silent:
            await w.close()
        await delete_all(http, made)
    c.observed = (f"offers {sorted(set(codes))}, full: {r.status_code} Retry-After {retry:g} s; admitted after "
                  f"{admitted_at and round(admitted_at, 1)} s")
    c.ok = r.status_code == 503 and admitted_at is not None and admitted_at <= 25 and retry <= admitted_at + 1.5
    return c


async def case_ids(url: str, mport: int) -> list[Case]:
    probe = Case("ids: an unknown and a real id, no or a wrong token", "the same answer on every surface")
    metrics = Case("metrics: anonymous GET /metrics on the API port", "no session id (they are on --metrics-port)")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = await create(http)
        real, unknown, differ, tried = s["session_id"], "0123456789abcdef", [], 0
        for headers in ({}, {"Authorization": "Bearer nope"}):
            for method, path, body in (("GET", "", None), ("DELETE", "", None),
                                       ("POST", "/webrtc", {"sdp": "v=0", "type": "offer"}),
                                       ("POST", "/rpc", {"id": 1, "method": "get_state"})):
                a = await http.request(method, f"/v1/sessions/{real}{path}", json=body, headers=headers)
                b = await http.request(method, f"/v1/sessions/{unknown}{path}", json=body, headers=headers)
                tried += 1
                if (a.status_code, a.content) != (b.status_code, b.content):
                    differ.append(f"{method} {path or '/'}: {a.status_code} vs {b.status_code}")

        async def stream_answer(sid: str, headers: dict[str, str]) -> tuple[Any, Any]:
            async with connect(ws(url, f"/v1/sessions/{sid}/stream"), additional_headers=headers,
                               compression=None) as w:
                if not headers:
                    await w.send(json.dumps({"type": "auth", "token": "nope"}))
                msg = json.loads(await asyncio.wait_for(w.recv(), 15))
                await asyncio.wait_for(w.wait_closed(), 15)
                return msg.get("code"), w.close_code

        for headers in ({"Authorization": "Bearer nope"}, {}):
            a, b = await asyncio.gather(stream_answer(real, headers), stream_answer(unknown, headers))
            tried += 1
            if a != b:
                differ.append(f"stream: {a} vs {b}")
        text = (await http.get("/metrics")).text
        internal = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).text
        await delete_all(http, [s])
    probe.observed = f"{tried} surfaces, {len(differ)} differ" + (f": {differ}" if differ else "")
    probe.ok = not differ
    metrics.observed = (f"session id on the API port: {real in text}; aggregate series on --metrics-port: "
                        f"{'worldcast_step_seconds' in internal}")
    metrics.ok = real not in text and "worldcast_step_seconds" in internal
    return [probe, metrics]


async def case_stream_floods(url: str) -> list[Case]:
    from worldcast.transport.clients import StreamClient

    junk = Case("flood: bad JSON on the stream, 2,000 msg/s",
                f"summaries, cut off (1008) within ~{FLOOD_SUSTAINED_S:g} s")
    dirs = Case("flood: 5,000 directions in about a second",
                "a few error summaries, not one per refusal; the flooder cut off (1008)")
    async with await StreamClient.connect(url, mode="directing", seed=1) as c:
        t0 = time.monotonic()
        with contextlib.suppress(ConnectionClosed):
            for i in range(5000):
                await c.send_raw(json.dumps({"type": "direction", "id": f"d{i}", "prompt": "a snowy field"}))
        sent_s = time.monotonic() - t0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(c._reader, 10)  # noqa: SLF001 - until the close is read
        errors = [e for e in c.events if e["event"] == "error"]
        acks = sum(1 for e in c.events if e["event"] == "direction_ack")
        dirs.observed = (f"sent in {sent_s:.1f} s; {len(errors)} error events counting "
                         f"{sum(e.get('count', 1) for e in errors)} refusals, {acks} acks; closed {c.closed_code}")
        dirs.ok = len(errors) <= 12 and c.closed_code == 1008
    async with await StreamClient.connect(url, seed=2) as c:
        await c.next_frame(60)
        t0, sent = time.monotonic(), 0
        while c.closed_code is None and time.monotonic() - t0 < 15:
            try:
                for _ in range(20):
                    await c.send_raw("{junk")
                sent += 20
            except Exception:  # noqa: BLE001 - closed under us
                break
            await asyncio.sleep(max(0.0, t0 + sent / 2000 - time.monotonic()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(c._reader, 5)  # noqa: SLF001 - until the close is read
        took = time.monotonic() - t0
        replies = [e for e in c.events if e["event"] in ("error", "disconnect")]
        junk.observed = f"{sent} sent, {len(replies)} replies, closed {c.closed_code} after {took:.1f} s"
        junk.ok = c.closed_code == 1008 and took <= FLOOD_SUSTAINED_S + 5 and len(replies) <= 4 * took + 4
    return [junk, dirs]


async def case_webrtc_flood(url: str, seconds: float) -> Case:
    from worldcast.latency_bench.flood import _window
    from worldcast.latency_bench.probe import SessionProbe

    c = Case(f"flood: 2,000 action msg/s on WebRTC, {seconds:g} s windows",
             "the neighbour keeps >= 90 % of its frames/s beside a CPU burner (flood / burner)")
    victim = await SessionProbe.open(url, seed=3, stamped=False)
    try:
        await victim.first_frame(60)
        await victim.act_for(2.0, 4.0)
        quiet, _ = await _window(victim, seconds, None)
        burner, _ = await _window(victim, seconds, [sys.executable, "-c", "while True: pass"])
        flood, _ = await _window(victim, seconds, [sys.executable, "-m", "worldcast.latency_bench.flood", "--flooder",
                                                   url, "--rate", "2000", "--seconds", str(seconds)], wait_child=True)
    finally:
        await victim.close()
    c.observed = (f"frames/s quiet {quiet:.1f}, burner {burner:.1f}, flood {flood:.1f}: flood/burner "
                  f"{flood / burner:.2f}, flood/quiet {flood / quiet:.2f}")
    c.ok = flood / burner >= 0.9
    return c


async def case_prompts(url: str) -> Case:
    from worldcast.transport.clients import StreamClient

    c = Case('prompts: "\\u200b" (and other invisible ones) on every surface', "refused everywhere")
    refused: dict[str, bool] = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        refused["POST /v1/sessions"] = (await http.post("/v1/sessions", json={"prompt": "\u200b"})).status_code == 422
        s = await create(http)
        r = await http.post(f"/v1/sessions/{s['session_id']}/rpc", headers={"Authorization": f"Bearer {s['token']}"},
                            json={"id": 1, "method": "set_prompt", "params": {"prompt": "\ufeff\u200d"}})
        refused["HTTP set_prompt"] = r.status_code == 400
        await delete_all(http, [s])
    async with await StreamClient.connect(url, mode="directing", seed=4) as sc:
        _, fut, _ = await sc.send_direction("\u200b", direction_id="x")
        refused["stream direction"] = (await asyncio.wait_for(fut, 10))["event"] == "error"
    async with connect(ws(url, "/ws"), compression=None, max_size=2**24) as w:
        await w.send(json.dumps({"type": "session_init_v2", "curated_prompts": ["a meadow"]}))
        await w.send(json.dumps({"type": "append_prompt", "prompt": "\U000e0041\u200b", "prompt_id": "p"}))
        seen = None
        t0 = time.monotonic()
        while seen is None and time.monotonic() - t0 < 15:
            m = await asyncio.wait_for(w.recv(), 15)
            if isinstance(m, str):
                d = json.loads(m)
                if d.get("type") == "error" and d.get("error_code") == "bad_prompt":
                    seen = True
                elif d.get("type") == "prompt_received":
                    seen = False
        refused["Dreamverse append_prompt"] = bool(seen)
    c.observed = ", ".join(f"{k}: {'refused' if v else 'ACCEPTED'}" for k, v in refused.items())
    c.ok = all(refused.values())
    return c


async def case_content_types(url: str) -> Case:
    c = Case("content types on every JSON route", "415 for other types and for a body without one")
    got = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = await create(http)
        h = {"Authorization": f"Bearer {s['token']}"}
        for path in ("/v1/sessions", f"/v1/sessions/{s['session_id']}/webrtc", f"/v1/sessions/{s['session_id']}/rpc"):
            for extra, body in (({}, b"{}"), ({"Content-Type": "text/plain"}, b""),
                                ({"Content-Type": "text/plain"}, b"{}")):
                got.append((await http.post(path, content=body, headers={**h, **extra})).status_code)
        r = await http.post("/v1/sessions", content=b"")  # no body: README's decision, every default
        empty = r.status_code
        await delete_all(http, [s] + ([r.json()] if empty == 201 else []))
    c.observed = f"{len(got)} requests: {sorted(set(got))}; empty body, no type, on create: {empty}"
    c.ok = set(got) == {415} and empty == 201
    return c


async def case_slow_heads(url: str) -> list[Case]:
    slow = Case("slow request heads: 20 sockets, one byte a second", f"closed (408) within ~{HEAD_TIMEOUT_S:g} s")
    many = Case("one address opens 80 connections", "those past 64 refused (503) at once")
    host, port = url.removeprefix("http://").split(":")
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 64

    def run_slow() -> tuple[list[bytes], float]:
        socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(20)]
        for sk in socks:
            sk.setblocking(False)
        got = [b""] * len(socks)
        t0 = time.monotonic()
        for i in range(int(HEAD_TIMEOUT_S) + 8):
            for k, sk in enumerate(socks):
                if not got[k]:
                    with contextlib.suppress(OSError):
                        sk.send(head[i:i + 1])
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                for k, sk in enumerate(socks):
                    if not got[k]:
                        try:
                            got[k] = sk.recv(200) or b"(closed)"
                        except BlockingIOError:
                            pass
                        except OSError:
                            got[k] = b"(reset)"
                time.sleep(0.05)
            if all(got):
                break
        took = time.monotonic() - t0
        for sk in socks:
            sk.close()
        return got, took

    got, took = await asyncio.to_thread(run_slow)
    n408 = sum(g.startswith(b"HTTP/1.1 408") for g in got)
    slow.observed = f"{n408}/20 answered 408 and closed, the last after {took:.1f} s"
    slow.ok = n408 == 20 and took <= HEAD_TIMEOUT_S + 5

    def run_many() -> int:
        socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(80)]
        time.sleep(0.3)
        refused = 0
        for sk in socks:
            sk.setblocking(False)
            try:
                refused += sk.recv(200).startswith(b"HTTP/1.1 503")
            except (BlockingIOError, OSError):
                pass
            sk.close()
        return refused

    refused = await asyncio.to_thread(run_many)
    many.observed = f"{refused} of 80 refused with 503"
    many.ok = refused == 16
    return [slow, many]


async def case_client(url: str) -> Case:
    from worldcast.transport.clients.session_api import SEQ_MAX
    from worldcast.transport.clients.webrtc import WebRTCClient

    c = Case("the Python client: seq near 2**53, a notification, a batch",
             "seq restarts and keys apply; notification returns None at once; batch refused clearly")
    async with await WebRTCClient.connect(url, seed=5) as w:
        await w.next_frame()
        w.seq = SEQ_MAX - 2
        seqs = [w.send_action(keys=["w"]) for _ in range(3)]
        applied = None
        for _ in range(100):
            applied = (await w.rpc("get_state"))["last_action_seq"]
            if applied == seqs[-1]:
                break
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        note = await w.rpc("", raw={"jsonrpc": "2.0", "method": "flush"})
        note_s = time.monotonic() - t0
        try:
            await w.rpc("", raw=[{"jsonrpc": "2.0", "id": 1, "method": "flush"}])
            batch = "sent"
        except ValueError as e:
            batch = f"ValueError ({str(e)[:40]}...)"
    c.observed = (f"seqs {seqs}, server's last {applied}; notification -> {note} in {note_s * 1e3:.0f} ms; "
                  f"batch: {batch}")
    c.ok = seqs[-1] < seqs[0] and applied == seqs[-1] and note is None and note_s < 1 and batch.startswith("ValueError")
    return c


async def case_rss(url: str, peaks: int) -> Case:
    from worldcast.latency_bench import rss

    c = Case(f"memory: {peaks} peaks of 8 sessions (4 WebRTC, 4 stream), each deleted",
             "RSS after each within 5 % of the first post-warm-up value")
    res = await rss.run(url, peaks=peaks, sessions=8, hold_s=2.0, settle_s=4.0)
    c.observed = ", ".join(f"{p['rss_mib']:.0f}" for p in res["peaks"]) + f" MiB: max growth {res['max_growth']:+.1%}"
    c.ok = bool(res["bar_met"])
    return c


async def case_livekit(url: str, lk: Any) -> list[Case]:
    from livekit import rtc

    from worldcast.transport.clients.livekit import LiveKitUser

    made = Case("LiveKit: create with README's flags (no --video-scale)", "201, and the video streams")
    ttl = Case(f"LiveKit: the user's token {TOKEN_TTL_S + 2:g} s after a {TOKEN_TTL_S:g} s TTL",
               "refused, or removed by the world within 5 s (livekit-server takes a token up to 60 s past its exp)")
    try:
        u = await LiveKitUser.create(url, room="attack-1", seed=6)
        f = await u.next_frame(30)
        made.observed, made.ok = f"201, video {f.width}x{f.height}", True
        await u.aclose()
    except Exception as e:  # noqa: BLE001
        made.observed, made.ok = f"{type(e).__name__}: {e}", False
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.post("/v1/sessions", json={"transport": "livekit", "room": "attack-2"})
        s = r.json()
        await asyncio.sleep(TOKEN_TTL_S + 2)
        room = rtc.Room()
        left = asyncio.Event()
        room.on("disconnected", lambda *_: left.set())
        removed_s: float | None = None
        try:
            await asyncio.wait_for(room.connect(s["livekit"]["url"], s["livekit"]["token"]), 10)
            joined = True
            t0 = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(left.wait(), 5.0)
            removed_s = time.monotonic() - t0 if left.is_set() else None
        except Exception:  # noqa: BLE001 - refused: expired
            joined = False
        await room.disconnect()
        await delete_all(http, [s])
    # livekit-server accepts a token up to about 60 s past its exp (transport/livekit/tokens.py SERVER_LEEWAY_S):
    # the world removes a user whose token has expired as soon as it joins (issue 31's design)
    ttl.observed = ("refused (token is expired)" if not joined else
                    f"joined, removed by the world after {removed_s * 1e3:.0f} ms" if removed_s is not None else
                    "joined and still in the room after 5 s")
    ttl.ok = not joined or removed_s is not None
    return [made, ttl]


async def case_livekit_failed(url: str) -> Case:
    c = Case("LiveKit unreachable: 10 creates", "each 502, nothing held: then a create is admitted")
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        codes = [(await http.post("/v1/sessions", json={"transport": "livekit", "room": "r"})).status_code
                 for _ in range(10)]
        r = await http.post("/v1/sessions", json={})
        if r.status_code == 201:
            await delete_all(http, [r.json()])
    c.observed = f"creates {sorted(set(codes))}; then {r.status_code}"
    c.ok = set(codes) == {502} and r.status_code == 201
    return c


def table(rep: Report) -> str:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="make attack (issue 22)", title_justify="left", show_lines=True)
    for col in ("case", "must", "observed", ""):
        t.add_column(col, overflow="fold")
    for c in rep.cases:
        t.add_row(c.name, c.must, c.observed, "skip" if c.ok is None else "ok" if c.ok else "FAIL")
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(t)
    return console.export_text()


def run(skip: set[str], rss_peaks: int, flood_s: float) -> Report:
    from worldcast.latency_bench.livekit_server import binary, run_livekit_server

    rep = Report()
    exe = binary()
    lk_ctx = run_livekit_server(exe) if exe is not None else contextlib.nullcontext(None)
    with lk_ctx as lk:
        lk_flags = ([] if lk is None else ["--livekit-url", lk.url, "--livekit-api-key", lk.api_key,
                                           "--livekit-api-secret", lk.api_secret,
                                           "--livekit-token-ttl", str(TOKEN_TTL_S)])
        with serve(*lk_flags) as (url, mport):
            steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("capacity", lambda: case_capacity(url)), ("ids and metrics", lambda: case_ids(url, mport)),
                ("stream floods", lambda: case_stream_floods(url)), ("prompts", lambda: case_prompts(url)),
                ("content types", lambda: case_content_types(url)), ("slow heads", lambda: case_slow_heads(url)),
                ("client", lambda: case_client(url))]
            if lk is not None:
                steps.append(("LiveKit", lambda: case_livekit(url, lk)))
            if "flood" not in skip:
                steps.append(("WebRTC flood", lambda: case_webrtc_flood(url, flood_s)))
            if "rss" not in skip:
                steps.append(("memory", lambda: case_rss(url, rss_peaks)))
            for name, step in steps:
                try:
                    out = asyncio.run(step())
                except Exception as e:  # noqa: BLE001 - one failed case must not hide the others
                    out = Case(name, "runs", f"{type(e).__name__}: {e}", False)
                rep.cases += out if isinstance(out, list) else [out]
                print(f"  {rep.cases[-1].name}: {rep.cases[-1].observed}", file=sys.stderr)
        if lk is None:
            rep.cases.append(Case("LiveKit cases", "livekit-server built (make livekit-server)", "not built", None))
    if "livekit-failed" not in skip:
        with serve("--livekit-url", f"ws://127.0.0.1:{_free_port()}", "--livekit-api-key", "k",
                   "--livekit-api-secret", "s" * 32) as (url, _):
            rep.cases.append(asyncio.run(case_livekit_failed(url)))
    return rep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.attack", description=__doc__.split("\n\n")[0])
    p.add_argument("--skip", default="", help="comma-separated: flood, rss, livekit-failed")
    p.add_argument("--rss-peaks", type=int, default=4)
    p.add_argument("--flood-seconds", type=float, default=6.0)
    p.add_argument("--out", type=Path, default=None, help="write the cases as JSON here")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    rep = run({x.strip() for x in a.skip.split(",") if x.strip()}, a.rss_peaks, a.flood_seconds)
    print(table(rep))
    print(f"{sum(c.ok is True for c in rep.cases)} held, {sum(c.ok is False for c in rep.cases)} failed, "
          f"{sum(c.ok is None for c in rep.cases)} skipped in {time.monotonic() - t0:.0f} s "
          f"(load average {os.getloadavg()[0]:.1f} at the end)")
    if a.out:
        a.out.write_text(json.dumps([c.__dict__ for c in rep.cases], indent=1))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
