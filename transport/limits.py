"""Input limits and flood policy for one client connection, for any transport.

`InputGuard` decides, per message and before any JSON is parsed, whether a
client's action or control message is admitted (size, then rate); it
coalesces the client's rejections and ignored messages into summary events
(at most one event of each kind per `report_interval_s`), and says when a
client has exceeded its limits for long enough to be disconnected. It does
no I/O and takes time as an argument: a transport (WebRTC data channels,
LiveKit data packets, a WebSocket) sends what it returns, arms a timer for
`next_drain_s`, and closes the connection when `verdict` names a reason.

Every message a client sends counts toward one flood verdict, whatever its kind and transport: actions,
control requests, and on sockets that carry several kinds (the WebSocket stream, Dreamverse's `/ws`) any
message at all, which is size- and rate-checked as a `"stream"` message before it is parsed; a stream's
refusals that are neither actions nor RPCs (bad JSON, unknown types, directions over the rate, ...) come
back as coalesced `error` events.

Events it builds (sent on the control channel, or the transport's equivalent):
    {"event": "action_rejected", "seq", "code", "message", "count", "counts": {code: n}}
        the first rejection of a quiet interval at once (count 1); later ones of the interval as one
        summary at its end, with the first one's seq, code and message and the counts by code
    {"event": "action_ignored", "reason": "stale_seq", "seq", "count", "message"}
        messages applied for mouse movement only (see `sessions/actions.py`), coalesced the same way
    {"event": "rpc_rejected", "code": -32001, "message", "count", "ids": [...]}
        rate-limited control requests past the reply budget: their ids (the first `MAX_SUMMARY_IDS`),
        so a client fails those calls at once instead of waiting for replies
    {"event": "error", "code", "message", ["id"/"type" of the first], "count", "counts": {code: n}[, "ids"]}
        a refused stream message, coalesced as `action_rejected` is (`ids`: those of the refused
        requests that had one, the first `MAX_SUMMARY_IDS`)
    {"event": "disconnect", "reason": "flood", "message"}
        sent before the transport closes a client that kept exceeding its limits
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from worldcast.transport import errors
from worldcast.transport.schemas import MAX_CONTROL_BYTES, MAX_MESSAGE_BYTES

Channel = Literal["actions", "control", "stream"]
#: Ids of rate-limited control requests listed in one `rpc_rejected` summary, at most.
MAX_SUMMARY_IDS = 64
#: A JSON-RPC id near the start of a message, read without parsing it (for replies to unparsed messages).
_HEAD_ID = re.compile(
    rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"[^"\\]{0,8}"\s*,\s*)?"id"\s*:\s*(-?\d{1,16}|"[^"\\]{0,64}")\s*[,}]')


@dataclass(frozen=True)
class InputLimits:
    """Per-connection limits; rates in messages/s, sizes in bytes, times in s."""

    action_rate_hz: float = 250.0  #: action messages applied per second
    action_burst: float = 60.0  #: ... in bursts of up to this many
    control_rate_hz: float = 10.0  #: control requests run per second (each may embed a prompt)
    control_burst: float = 20.0  #: ... in bursts of up to this many
    #: messages of any kind per second on a socket that carries several (WebSocket stream, Dreamverse),
    #: checked before parsing: room for the action and control rates together
    message_rate_hz: float = 270.0
    message_burst: float = 90.0  #: ... in bursts of up to this many
    max_action_bytes: int = MAX_MESSAGE_BYTES  #: largest action message
    max_control_bytes: int = MAX_CONTROL_BYTES  #: largest control message
    report_interval_s: float = 0.5  #: at most one event of each kind per interval
    control_reply_rate_hz: float = 10.0  #: individual error replies to rate-limited control requests per second
    control_reply_burst: float = 10.0  #: ... in bursts; past it, `rpc_rejected` summaries
    abuse_rejections_per_s: float = 100.0  #: a second with more rejected messages than this counts as abuse
    abuse_sustained_s: float = 5.0  #: this many consecutive seconds of abuse disconnect the client
    #: rejected messages beyond `abuse_rejections_per_s` (a leaky bucket draining at that rate) that disconnect
    #: the client as soon as they add up: the faster the flood, the sooner (1,750 rejected/s: 0.6 s; 750/s:
    #: 1.5 s). A flood costs its neighbours in transport work per packet (aiortc's SCTP and DTLS in Python,
    #: before our handler runs; BENCHMARKS, RELIABILITY), so a fast one is not given the sustained window
    abuse_burst_rejections: float = 1000.0

    def __post_init__(self) -> None:
        for name in ("action_rate_hz", "action_burst", "control_rate_hz", "control_burst", "message_rate_hz",
                     "message_burst", "report_interval_s",
                     "control_reply_rate_hz", "control_reply_burst", "abuse_rejections_per_s",
                     "abuse_sustained_s", "abuse_burst_rejections"):
            v = getattr(self, name)
            if not v > 0 or v != v or v == float("inf"):
                raise ValueError(f"InputLimits.{name} must be positive and finite, got {v!r}")
        if self.max_action_bytes < 1 or self.max_control_bytes < 1:
            raise ValueError("InputLimits: message sizes must be >= 1 byte")


class TokenBucket:
    """Rate limiter: `rate_hz` tokens per second, bursts up to `burst` (time passed in, s)."""

    def __init__(self, rate_hz: float, burst: float) -> None:
        self.rate_hz, self.burst = rate_hz, burst
        self._tokens = burst
        self._last_s: float | None = None

    def take(self, now_s: float) -> bool:
        """Take one token if there is one."""
        if self._last_s is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now_s - self._last_s) * self.rate_hz)
        self._last_s = now_s
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


@dataclass(frozen=True)
class Rejection:
    """Why a message was refused before parsing: a JSON-RPC code and a one-line reason."""

    code: int
    message: str
    outcome: str  #: metrics label: "too_large" or "rate_limited"


def message_size(raw: str | bytes, limit: int) -> int:
    """Size of a message in UTF-8 bytes, cheaply: a str of more than `limit` characters is not encoded."""
    if isinstance(raw, bytes | bytearray | memoryview):
        return len(raw)
    if len(raw) > limit:
        return len(raw)  # at least this many bytes: over the limit whatever its encoding
    return len(raw.encode("utf-8", "surrogatepass"))


def head_id(raw: str | bytes) -> int | str | None:
    """The JSON-RPC `id` of a message that is not (or not yet) parsed, if it opens the object.

    Reads only the first 256 bytes; None when no id is found there.
    """
    head = (raw[:256].encode("utf-8", "replace") if isinstance(raw, str) else bytes(raw[:256]))
    m = _HEAD_ID.match(head)
    if m is None:
        return None
    tok = m.group(1).decode("utf-8", "replace")
    return tok[1:-1] if tok.startswith('"') else int(tok)


_OUTCOMES = {errors.PARSE_ERROR: "parse_error", errors.INVALID_REQUEST: "invalid", errors.METHOD_NOT_FOUND: "invalid",
             errors.INVALID_PARAMS: "invalid", errors.RATE_LIMITED: "rate_limited",
             errors.SESSION_CLOSED: "closed", errors.INTERNAL_ERROR: "internal"}


#: Coalesced kinds whose summaries count by code.
_COUNTED = frozenset({"action_rejected", "error"})


@dataclass
class _Coalescer:
    """One kind of event: sent at once after a quiet interval, else summed until the interval ends."""

    last_sent_s: float = float("-inf")
    first: dict[str, Any] | None = None
    count: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    ids: list[Any] = field(default_factory=list)


class InputGuard:
    """Limits, coalesced feedback and the flood verdict for one client connection.

    Args:
        limits: the limits.
        on_count: metrics hook, called as on_count(channel, outcome, n) for every message counted;
            outcomes: accepted, too_large, rate_limited, parse_error, invalid, closed, internal, ignored,
            dropped (after the flood verdict).
    """

    def __init__(self, limits: InputLimits | None = None, *,
                 on_count: Callable[[str, str, int], None] | None = None) -> None:
        self.limits = lim = limits or InputLimits()
        self._buckets = {"actions": TokenBucket(lim.action_rate_hz, lim.action_burst),
                         "control": TokenBucket(lim.control_rate_hz, lim.control_burst),
                         "stream": TokenBucket(lim.message_rate_hz, lim.message_burst)}
        self._reply_bucket = TokenBucket(lim.control_reply_rate_hz, lim.control_reply_burst)
        self._kinds: dict[str, _Coalescer] = {}
        self._on_count = on_count
        self.counts: dict[tuple[str, str], int] = {}
        self._window_start_s: float | None = None
        self._window_rejections = 0
        self._abuse_since_s: float | None = None
        self._excess = 0.0  #: rejected messages beyond abuse_rejections_per_s, leaking at that rate
        self._excess_t: float | None = None
        self.disconnect_reason: str | None = None

    # -- counting ------------------------------------------------------------------------------

    def _count(self, channel: str, outcome: str, now_s: float) -> None:
        self.counts[(channel, outcome)] = self.counts.get((channel, outcome), 0) + 1
        if self._on_count is not None:
            self._on_count(channel, outcome, 1)
        self._abuse_tick(now_s, 0 if outcome in ("accepted", "ignored") else 1)

    def _abuse_tick(self, now_s: float, rejected: int) -> None:
        """Count rejections in 1 s windows; a run of abusive windows lasting `abuse_sustained_s` is a flood,
        and so are `abuse_burst_rejections` rejections beyond `abuse_rejections_per_s`, as soon as they add up.

        A window is abusive with more than `abuse_rejections_per_s` rejections; a quiet second
        between windows (no message at all) breaks the run.
        """
        lim = self.limits
        if self._window_start_s is None:
            self._window_start_s = now_s
        elif now_s - self._window_start_s >= 1.0:
            abusive = self._window_rejections > lim.abuse_rejections_per_s
            consecutive = now_s - self._window_start_s < 2.0
            if abusive and consecutive:
                if self._abuse_since_s is None:
                    self._abuse_since_s = self._window_start_s
                if now_s - self._abuse_since_s >= lim.abuse_sustained_s and self.disconnect_reason is None:
                    self.disconnect_reason = (
                        f"flood: more than {lim.abuse_rejections_per_s:g} rejected messages/s for "
                        f"{lim.abuse_sustained_s:g} s")
            else:
                self._abuse_since_s = None
            self._window_start_s, self._window_rejections = now_s, 0
        self._window_rejections += rejected
        if self._excess_t is not None:
            self._excess = max(0.0, self._excess - max(0.0, now_s - self._excess_t) * lim.abuse_rejections_per_s)
        self._excess_t = now_s
        self._excess += rejected
        if self._excess > lim.abuse_burst_rejections and self.disconnect_reason is None:
            self.disconnect_reason = (f"flood: more than {lim.abuse_burst_rejections:g} rejected messages beyond "
                                      f"{lim.abuse_rejections_per_s:g}/s")

    # -- before parsing ------------------------------------------------------------------------

    def admit(self, channel: Channel, raw: str | bytes, now_s: float, *,
              max_bytes: int | None = None) -> Rejection | None:
        """Size, then rate, of one message, before it is parsed; None if it may be parsed and applied.

        Args:
            max_bytes: the size limit (default: the channel's; `"stream"` messages must give one).

        A refused message is not counted yet; report it with `rejected_action`, `rejected_control` or
        `rejected_message`.
        """
        if max_bytes is None:
            max_bytes = self.limits.max_action_bytes if channel == "actions" else self.limits.max_control_bytes
        what = {"actions": "action", "control": "control", "stream": ""}[channel]
        size = message_size(raw, max_bytes)
        if size > max_bytes:
            return Rejection(errors.INVALID_REQUEST, f"{what + ' ' if what else ''}message of {size} bytes exceeds "
                             f"{max_bytes}", "too_large")
        if not self._buckets[channel].take(now_s):
            return Rejection(errors.RATE_LIMITED, f"too many {what + ' ' if what else ''}messages; slow down",
                             "rate_limited")
        return None

    def take(self, channel: Channel, now_s: float) -> bool:
        """Take one message from a channel's rate budget, for a message whose kind is known only once
        parsed (a direction or RPC on a stream counts against the control budget); False: over the rate."""
        return self._buckets[channel].take(now_s)

    def accepted(self, channel: Channel, now_s: float) -> None:
        """Count an applied message."""
        self._count(channel, "accepted", now_s)

    def dropped(self, channel: Channel, now_s: float) -> None:
        """Count a message dropped unread after the flood verdict (the connection is closing)."""
        self._count(channel, "dropped", now_s)

    # -- feedback ------------------------------------------------------------------------------

    def _record(self, kind: str, payload: dict[str, Any], key: str, now_s: float, *,
                rid: Any = None, coalesce: bool = True) -> list[dict[str, Any]]:
        c = self._kinds.setdefault(kind, _Coalescer())
        if not coalesce or (c.first is None and now_s - c.last_sent_s >= self.limits.report_interval_s):
            c.last_sent_s = now_s
            ev = dict(payload, count=1)
            if kind in _COUNTED:
                ev["counts"] = {key: 1}
            if kind == "rpc_rejected" or (kind == "error" and rid is not None):
                ev["ids"] = [rid]
            return [ev]
        if c.first is None:
            c.first = payload
        c.count += 1
        c.counts[key] = c.counts.get(key, 0) + 1
        if (kind == "rpc_rejected" or rid is not None) and len(c.ids) < MAX_SUMMARY_IDS:
            c.ids.append(rid)
        return []

    def rejected_message(self, channel: Channel, code: str, message: str, now_s: float, *, outcome: str,
                         ref: dict[str, Any] | None = None, rid: Any = None) -> list[dict[str, Any]]:
        """Count a refused message that is neither an action nor an RPC reply (a stream's bad JSON, unknown
        type, binary message, a direction over the rate, ...); returns the `error` events to send now
        (the first of a quiet interval; the rest come as one summary from `drain`).

        Args:
            code: the stable error code (`bad_json`, `rate_limited`, ...).
            outcome: the metrics label (parse_error, invalid, rate_limited, too_large, ...).
            ref: fields naming what the error refers to (`{"id": ...}`, `{"type": ...}`), in the first event.
            rid: the refused request's id, if any, listed in the summary's `ids`.
        """
        self._count(channel, outcome, now_s)
        return self._record("error", {"event": "error", "code": code, "message": message, **(ref or {})}, code,
                            now_s, rid=rid)

    def rejected_action(self, code: int, message: str, *, seq: Any, now_s: float,
                        outcome: str | None = None, coalesce: bool = True) -> list[dict[str, Any]]:
        """Count a refused action message; returns the events to send now (often none: see `drain`).
        With `coalesce` False, its own event at once (for callers that never drain)."""
        self._count("actions", outcome or _OUTCOMES.get(code, "invalid"), now_s)
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        return self._record("action_rejected", {"event": "action_rejected", "seq": seq, "code": code,
                                                "message": message}, str(code), now_s, coalesce=coalesce)

    def ignored_action(self, seq: int, message: str, now_s: float, *, coalesce: bool = True) -> list[dict[str, Any]]:
        """Count an action applied for mouse movement only (stale seq); returns the events to send now."""
        self._count("actions", "ignored", now_s)
        return self._record("action_ignored", {"event": "action_ignored", "reason": "stale_seq", "seq": seq,
                                               "message": message}, "stale_seq", now_s, coalesce=coalesce)

    def rejected_control(self, rid: Any, rejection: Rejection, now_s: float) -> list[dict[str, Any]]:
        """Count a control request refused before parsing (`admit`); returns what to send now.

        Within the reply budget that is its own JSON-RPC error reply (with `rid`); past it, nothing
        now and an `rpc_rejected` summary listing its id later.
        """
        self._count("control", rejection.outcome, now_s)
        if self._reply_bucket.take(now_s):
            return [{"id": rid, "error": {"code": rejection.code, "message": rejection.message}}]
        return self._record("rpc_rejected", {"event": "rpc_rejected", "code": rejection.code,
                                             "message": rejection.message}, str(rejection.code), now_s, rid=rid)

    def control_result(self, reply: dict[str, Any], now_s: float) -> None:
        """Count a control request that was parsed and answered (`reply` is what was sent)."""
        err = reply.get("error")
        self._count("control", "accepted" if err is None else _OUTCOMES.get(err.get("code"), "invalid"), now_s)

    @property
    def next_drain_s(self) -> float | None:
        """When `drain` has a summary to return, s; None if nothing is pending."""
        due = [c.last_sent_s + self.limits.report_interval_s for c in self._kinds.values() if c.first is not None]
        return min(due) if due else None

    def drain(self, now_s: float) -> list[dict[str, Any]]:
        """The summaries whose interval has ended."""
        out = []
        for kind, c in self._kinds.items():
            if c.first is None or now_s < c.last_sent_s + self.limits.report_interval_s:
                continue
            ev = dict(c.first, count=c.count)
            if kind in _COUNTED:
                ev["counts"] = dict(c.counts)
            if kind == "rpc_rejected" or c.ids:
                ev["ids"] = list(c.ids)
            out.append(ev)
            c.first, c.count, c.counts, c.ids, c.last_sent_s = None, 0, {}, [], now_s
        return out

    def verdict(self) -> dict[str, Any] | None:
        """The `disconnect` event to send before closing, once the client has flooded; else None."""
        if self.disconnect_reason is None:
            return None
        return {"event": "disconnect", "reason": "flood", "message": self.disconnect_reason}
