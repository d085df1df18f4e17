"""Run the fuzz strategies against the real parsers (pure) and a real server with real peers (live).

A *crash* is anything but a precise refusal: an exception escaping a handler,
a reply of the wrong shape or that cannot be sent as UTF-8, a 5xx, an ERROR
logged by the server, the fuzzed peer dropping, or the watching session (a
second session streaming throughout) going more than `MAX_WATCH_GAP_S`
without a frame. Every surface reports its case count and crashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from tests.fakes import FakeClock
from tests.fuzz.strategies import action_messages, control_messages, sdp_offers
from worldcast.engine.scripted import zero_context
from worldcast.models.spec import ConditioningRequest
from worldcast.sessions.session import Session
from worldcast.transport import errors
from worldcast.transport.limits import InputGuard, InputLimits
from worldcast.transport.rpc import ActionHandler, RpcHandler
from worldcast.transport.webrtc.sdp import validate_offer

#: Longest the watching session may go without a frame while a surface is fuzzed, s (a stall is unbounded;
#: this only has to tell one from a busy 2-core machine).
MAX_WATCH_GAP_S = 5.0
CODES = {errors.PARSE_ERROR, errors.INVALID_REQUEST, errors.METHOD_NOT_FOUND, errors.INVALID_PARAMS,
         errors.SESSION_CLOSED, errors.RATE_LIMITED}
EVENTS = {"action_rejected", "action_ignored", "rpc_rejected"}
#: Limits of the fuzzed server: high rates and no flood verdict, so fuzz cases reach the parser rather
#: than the rate limiter (the limiter has its own tests and the flood benchmark).
FUZZ_LIMITS = InputLimits(action_rate_hz=1e6, action_burst=1e6, control_rate_hz=1e6, control_burst=1e6,
                          message_rate_hz=1e6, message_burst=1e6,
                          abuse_rejections_per_s=1e9)


@dataclass
class SurfaceResult:
    """One surface's run."""

    surface: str
    level: str  #: "pure" or "live"
    cases: int = 0
    crashes: list[str] = field(default_factory=list)  #: the first few, described
    crash_count: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    watcher: dict[str, float] = field(default_factory=dict)  #: the second session while this ran

    def crash(self, what: str) -> None:
        self.crash_count += 1
        if len(self.crashes) < 10:
            self.crashes.append(what[:500])

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["outcomes"] = dict(self.outcomes.most_common(12))
        return d


def _settings(cases: int, seed: int) -> Callable[[Any], Any]:
    return settings(max_examples=cases, database=None, deadline=None, derandomize=False, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)


def _sendable(obj: Any) -> None:
    """What the server sends must be JSON and UTF-8 (aiortc encodes str messages as UTF-8)."""
    json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8")


def check_event(ev: dict[str, Any]) -> str | None:
    """None if `ev` is a well-formed feedback event or error reply, else what is wrong."""
    try:
        _sendable(ev)
    except (TypeError, ValueError) as e:
        return f"unsendable: {e!r}"
    if "event" in ev:
        if ev["event"] not in EVENTS or not isinstance(ev.get("message"), str) or ev.get("count", 0) < 1:
            return f"bad event {ev!r}"
        if ev["event"] != "action_ignored" and ev.get("code") not in CODES:
            return f"unknown code in {ev!r}"
        return None
    err = ev.get("error")
    if ("result" in ev) == (err is not None):
        return f"reply needs exactly one of result/error: {ev!r}"
    if err is not None and (err.get("code") not in CODES or not isinstance(err.get("message"), str)):
        return f"bad error {ev!r}"
    rid = ev.get("id")
    if not (rid is None or (isinstance(rid, int) and not isinstance(rid, bool)) or isinstance(rid, str)):
        return f"bad id in {ev!r}"
    return None


def _session(model: Any) -> Session:
    return Session("fuzz", "tok", model=model, conditioning=ConditioningRequest(text="a green meadow"),
                   context=zero_context(model.spec),
                   seed=0, clock=FakeClock())


def _quiet_random(fn: Callable[..., None]) -> Callable[..., None]:
    """Hypothesis warns when the global `random` state moves during a test: the live server's thread
    (aiortc, aioice) uses it concurrently, which does not affect what is drawn."""
    import functools
    import warnings

    @functools.wraps(fn)
    def wrapped(*a: Any, **kw: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*a, **kw)
    return wrapped


def collect(strategy: st.SearchStrategy[Any], n: int, seed: int) -> list[Any]:
    """Draw `n` examples of `strategy` (hypothesis's generation, no shrinking)."""
    out: list[Any] = []

    @_settings(n, seed)
    @given(x=strategy)
    def draw(x: Any) -> None:
        out.append(x)

    _quiet_random(draw)()
    return out


# -- pure: the shared parsers on a real session -------------------------------------------------------------


def fuzz_actions_pure(model: Any, cases: int, seed: int = 0) -> SurfaceResult:
    res, t0 = SurfaceResult("actions", "pure"), time.monotonic()
    session = _session(model)
    strict = ActionHandler(session.inputs, guard=InputGuard())  # the real limits: rate and size first
    loose = ActionHandler(session.inputs, guard=InputGuard(FUZZ_LIMITS))  # every case reaches the parser
    clock = [0.0]

    @_settings(cases, seed)
    @given(msg=action_messages)
    def run(msg: Any) -> None:
        res.cases += 1
        clock[0] += 0.001
        for h in (loose, strict):
            try:
                events = h.receive(msg, clock[0]) + h.guard.drain(clock[0])
            except Exception as e:  # noqa: BLE001
                res.crash(f"{type(e).__name__}: {e} on {msg!r:.200}")
                return
            for ev in events:
                bad = check_event(ev)
                if bad:
                    res.crash(bad)
    run()
    res.outcomes.update({f"{ch}:{o}": n for (ch, o), n in loose.guard.counts.items()})
    res.seconds = time.monotonic() - t0
    return res


def fuzz_rpc_pure(model: Any, cases: int, seed: int = 0) -> SurfaceResult:
    res, t0 = SurfaceResult("rpc", "pure"), time.monotonic()
    session = _session(model)
    handler = RpcHandler(session)
    loop = asyncio.new_event_loop()

    @_settings(cases, seed)
    @given(msg=control_messages)
    def run(msg: Any) -> None:
        res.cases += 1
        try:
            reply = loop.run_until_complete(handler.handle_raw(msg))
        except Exception as e:  # noqa: BLE001
            res.crash(f"{type(e).__name__}: {e} on {msg!r:.200}")
            return
        if reply is None:
            res.outcomes["notification"] += 1
            return
        bad = check_event(reply)
        if bad:
            res.crash(bad)
        res.outcomes["result" if "result" in reply else str(reply["error"]["code"])] += 1

    try:
        run()
    finally:
        loop.close()
    res.seconds = time.monotonic() - t0
    return res


def fuzz_sdp_pure(bases: list[str], cases: int, seed: int = 0) -> SurfaceResult:
    res, t0 = SurfaceResult("sdp", "pure"), time.monotonic()

    @_settings(cases, seed)
    @given(sdp=sdp_offers(bases))
    def run(sdp: str) -> None:
        res.cases += 1
        try:
            validate_offer(sdp)
            res.outcomes["accepted"] += 1
        except errors.InvalidOffer as e:
            msg = str(e)
            if "\n" in msg or len(msg) > 400:
                res.crash(f"imprecise refusal {msg[:120]!r}")
            res.outcomes[msg.split(":")[1].strip()[:40] if ":" in msg else msg[:40]] += 1
        except Exception as e:  # noqa: BLE001
            res.crash(f"{type(e).__name__}: {e} on {sdp!r:.200}")

    run()
    res.seconds = time.monotonic() - t0
    return res


# -- live: a real server, a fuzzed client and a watching one ------------------------------------------------


class ServerErrors(logging.Handler):
    """ERROR records logged in-process by the server's code, aiortc and asyncio during a run."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()[:300]}")

    @contextlib.contextmanager
    def installed(self) -> Iterator[ServerErrors]:
        names = ["worldcast", "asyncio", "aiortc", "aioice", "uvicorn.error"]
        for n in names:
            logging.getLogger(n).addHandler(self)
        try:
            yield self
        finally:
            for n in names:
                logging.getLogger(n).removeHandler(self)


def watch_stats(times: list[float], start: float, end: float) -> dict[str, float]:
    """Frames of the watching session in [start, end] and the longest gap between them (edges included), s."""
    inside = [t for t in times if start <= t <= end]
    edges = [start, *inside, end]
    return {"frames": len(inside), "max_gap_s": round(max(b - a for a, b in zip(edges, edges[1:])), 3),
            "fps": round(len(inside) / max(1e-9, end - start), 2)}


def _watch_check(res: SurfaceResult, times: Callable[[], list[float]], start: float) -> None:
    res.watcher = watch_stats(times(), start, time.monotonic())
    if res.watcher["max_gap_s"] > MAX_WATCH_GAP_S:
        res.crash(f"the watching session went {res.watcher['max_gap_s']} s without a frame")


def _expects_reply(m: str | bytes) -> bool:
    """Whether the server answers this control message (all but JSON-RPC 2.0 notifications)."""
    try:
        req = json.loads(m)
    except (ValueError, RecursionError):
        return True
    return not (isinstance(req, dict) and req.get("jsonrpc") == "2.0" and "id" not in req)


async def fuzz_channel_live(client: Any, channel: Any, messages: list[Any], surface: str,
                            watcher_times: Callable[[], list[float]], *, in_flight: int = 16) -> SurfaceResult:
    """Send `messages` on a data channel of the fuzzed client; it must stay connected and answer get_state.

    On the control channel at most `in_flight` requests await their replies at a time (the server runs
    them concurrently; the production rate limit is lifted for the fuzz, so this keeps the queue bounded).
    """
    res, t0 = SurfaceResult(surface, "live"), time.monotonic()
    replies = [0]
    control = channel is client.control
    def on_message(m: str | bytes) -> None:
        msg = json.loads(m)
        if "event" not in msg:
            replies[0] += 1
        elif msg["event"] == "rpc_rejected":  # refused past the reply budget: answered in a summary
            replies[0] += msg["count"]

    if control:
        channel.on("message", on_message)
    expected = 0
    for i, m in enumerate(messages):
        if isinstance(m, str):
            try:
                m.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: aiortc cannot send it as text; send its bytes
                m = m.encode("utf-8", "surrogatepass")
        if channel.readyState != "open":
            res.crash(f"the {surface} channel closed after {i} messages ({client.pc.connectionState})")
            break
        channel.send(m)
        res.cases += 1
        expected += control and _expects_reply(m)
        deadline = time.monotonic() + 30
        while control and expected - replies[0] > in_flight and channel.readyState == "open":
            if time.monotonic() > deadline:
                res.crash(f"no reply to {expected - replies[0]} control messages in 30 s")
                break
            await asyncio.sleep(0.005)
        if i % 25 == 24:
            await asyncio.sleep(0.005)  # let SCTP and the server keep up; a flood is the flood benchmark's
            while channel.bufferedAmount > 64 * 1024 and channel.readyState == "open":
                await asyncio.sleep(0.005)
    try:
        state = await client.rpc("get_state")
        res.outcomes["get_state_after"] += int(isinstance(state, dict))
    except Exception as e:  # noqa: BLE001
        res.crash(f"get_state after the {surface} fuzz failed: {e!r}")
    if client.pc.connectionState != "connected":
        res.crash(f"the fuzzed peer is {client.pc.connectionState}")
    for ev in list(client.events):
        if ev.get("event") in EVENTS or "error" in ev:
            res.outcomes[ev.get("event") or "error_reply"] += 1
            bad = check_event({k: v for k, v in ev.items() if k != "received_at"})
            if bad:
                res.crash(bad)
    _watch_check(res, watcher_times, t0)
    res.seconds = time.monotonic() - t0
    return res


async def fuzz_sdp_live(client: Any, offers: list[str], watcher_times: Callable[[], list[float]]) -> SurfaceResult:
    """POST mutated offers to the fuzzed session: 200 or 400 only; its live peer keeps streaming."""
    res, t0 = SurfaceResult("sdp", "live"), time.monotonic()
    url = f"/v1/sessions/{client.session_id}/webrtc"
    for sdp in offers:
        res.cases += 1
        try:
            r = await client.http.post(url, json={"sdp": sdp, "type": "offer"})
        except httpx.HTTPError as e:
            res.crash(f"{type(e).__name__} for the offer {sdp!r:.2000}")
            continue
        res.outcomes[str(r.status_code)] += 1
        if r.status_code >= 500 or r.status_code not in (200, 400, 422):
            res.crash(f"{r.status_code} for the offer {sdp!r:.2000}: {r.text[:200]}")
        elif r.status_code == 400 and "invalid SDP offer:" in r.text and "line" not in r.text:
            res.outcomes["aiortc refused: " + r.json()["detail"][18:70]] += 1
    n = len(client.frame_events)
    deadline = time.monotonic() + 30
    while len(client.frame_events) < n + 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if len(client.frame_events) < n + 3 or client.pc.connectionState != "connected":
        res.crash(f"the live peer stopped after the offers ({client.pc.connectionState})")
    _watch_check(res, watcher_times, t0)
    res.seconds = time.monotonic() - t0
    return res


def http_cases(openapi: dict[str, Any], cases: int, seed: int = 0) -> list[tuple[Any, bool]]:
    """Draw schemathesis cases from the app's OpenAPI schema, before any server runs: positive and negative
    cases of every operation (about `cases` in all), each with a flag: send it on the real session."""
    import schemathesis

    schemathesis.serializer.alias("application/sdp", "text/plain")  # WHEP's offers: SDP is text (RFC 8866 5)
    schema = schemathesis.openapi.from_dict(openapi)
    ops = [r.ok() for r in schema.get_all_operations()]
    per_op = max(1, cases // (2 * len(ops)))
    out: list[tuple[Any, bool]] = []
    rounds = 0
    while len(out) < cases and rounds < 20:  # small operations run out of distinct cases: draw again
        for op in ops:
            for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
                try:
                    out += collect(st.tuples(op.as_strategy(generation_mode=mode), st.booleans()), per_op,
                                   seed + rounds)
                except Unsatisfiable:  # e.g. negative cases of an operation without parameters
                    pass
        rounds += 1
    return out


def fuzz_http_live(url: str, cases: list[tuple[Any, bool]], *, token: str, session_id: str) -> SurfaceResult:
    """Send schemathesis cases (`http_cases`) to the server: half of them on a real session with its token
    (never its DELETE). Any 5xx but an admission refusal with Retry-After, or a 501 the route declares,
    is a crash."""
    res, t0 = SurfaceResult("http", "live"), time.monotonic()
    for case, real in cases:
        res.cases += 1
        method = case.operation.method.upper()
        headers = dict(case.headers or {})
        if real and "session_id" in (case.path_parameters or {}) and method != "DELETE":
            case.path_parameters = dict(case.path_parameters, session_id=session_id)
            headers["Authorization"] = f"Bearer {token}"
        try:
            r = case.call(base_url=url, headers=headers, timeout=30)
        except Exception as e:  # noqa: BLE001 - a malformed request the HTTP library refuses to send
            res.outcomes[f"not sent: {type(e).__name__}"] += 1
            continue
        res.outcomes[f"{method} {r.status_code}"] += 1
        if r.status_code == 503 and "retry-after" in {k.lower() for k in r.headers}:
            continue  # admission refused, with a retry hint: a precise answer
        if r.status_code == 501 and "501" in (case.operation.definition.raw.get("responses") or {}):
            continue  # a documented Not Implemented (e.g. Dreamverse's prompt-config save)
        if r.status_code >= 500:
            res.crash(f"{method} {case.operation.path} -> {r.status_code}: {r.text[:200]}")
    with httpx.Client(base_url=url, timeout=30) as http:
        if http.get("/healthz").status_code != 200:
            res.crash("server unhealthy after the HTTP fuzz")
    res.seconds = time.monotonic() - t0
    return res


def fuzz_config(base: Any) -> Any:
    """The fuzzed server's config: FUZZ_LIMITS, short negotiation and session timeouts."""
    from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
    from worldcast.sessions.manager import SessionConfig

    return replace(base, input_limits=FUZZ_LIMITS, negotiation_timeout_s=2.0, sessions=SessionConfig(
        idle_after_s=600.0, timeout_s=2.0, connect_grace_s=2.0, tick_s=0.2,
        admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=8)))
