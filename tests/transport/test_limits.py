"""InputGuard (transport/limits.py): limits before parsing, coalesced feedback, the flood verdict; time passed in."""

from __future__ import annotations

import pytest

from worldcast.transport import errors
from worldcast.transport.limits import MAX_SUMMARY_IDS, InputGuard, InputLimits, TokenBucket, head_id, message_size


def test_token_bucket_refills_at_its_rate() -> None:
    b = TokenBucket(10.0, 2.0)
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    assert not b.take(0.05)  # half a token
    assert b.take(0.1) and not b.take(0.1)
    assert not b.take(0.0)  # time going backwards adds nothing


def test_size_is_checked_before_rate_and_without_encoding_huge_strings() -> None:
    g = InputGuard(InputLimits(max_action_bytes=10, action_burst=1, action_rate_hz=1))
    assert g.admit("actions", "é" * 6, 0.0).outcome == "too_large"  # 6 characters, 12 bytes
    assert message_size("x" * 10**6, 10) == 10**6
    assert g.admit("actions", b"12345", 0.0) is None
    assert g.admit("actions", b"12345", 0.0).outcome == "rate_limited"  # one token only


def test_a_lone_rejection_is_reported_at_once_and_a_flood_as_one_summary_per_interval() -> None:
    g = InputGuard(InputLimits(report_interval_s=0.5))
    first = g.rejected_action(errors.INVALID_PARAMS, "unknown key 'fly'", seq=3, now_s=10.0)
    assert first == [{"event": "action_rejected", "seq": 3, "code": errors.INVALID_PARAMS,
                      "message": "unknown key 'fly'", "count": 1, "counts": {"-32602": 1}}]
    sent = []
    for i in range(1000):  # a flood within one interval: nothing more now
        sent += g.rejected_action(errors.PARSE_ERROR if i % 2 else errors.RATE_LIMITED, "x", seq=i, now_s=10.1)
    assert sent == [] and g.next_drain_s == pytest.approx(10.5)
    assert g.drain(10.4) == []
    (summary,) = g.drain(10.5)
    assert summary["count"] == 1000 and summary["counts"] == {"-32700": 500, "-32001": 500}
    assert summary["seq"] == 0 and summary["code"] == errors.RATE_LIMITED  # the interval's first
    assert g.next_drain_s is None and g.drain(99.0) == []
    assert g.counts[("actions", "parse_error")] == 500 and g.counts[("actions", "rate_limited")] == 500


def test_stale_messages_are_coalesced_separately() -> None:
    g = InputGuard()
    assert g.ignored_action(4, "stale", 0.0)[0]["event"] == "action_ignored"
    assert g.ignored_action(3, "stale", 0.1) == [] and g.ignored_action(2, "stale", 0.2) == []
    assert g.rejected_action(errors.INVALID_PARAMS, "bad", seq=1, now_s=0.2)[0]["count"] == 1  # its own kind
    (s,) = [e for e in g.drain(0.5) if e["event"] == "action_ignored"]
    assert s["count"] == 2 and s["seq"] == 3 and s["reason"] == "stale_seq"


def test_rate_limited_control_requests_are_answered_within_the_reply_budget_then_listed_by_id() -> None:
    g = InputGuard(InputLimits(control_rate_hz=1, control_burst=1, control_reply_rate_hz=1, control_reply_burst=2))
    assert g.admit("control", "{}", 0.0) is None
    replies = []
    for i in range(100):
        rej = g.admit("control", "{}", 0.0)
        assert rej is not None and rej.code == errors.RATE_LIMITED
        replies += g.rejected_control(i, rej, 0.0)
    direct = [r for r in replies if "id" in r]
    assert [r["id"] for r in direct] == [0, 1] and direct[0]["error"]["code"] == errors.RATE_LIMITED
    assert [r["event"] for r in replies if "event" in r] == ["rpc_rejected"]  # the first past the budget, at once
    (summary,) = g.drain(0.5)
    assert summary["count"] == 97 and summary["ids"] == list(range(3, 3 + MAX_SUMMARY_IDS))


def test_sustained_abuse_gets_a_verdict_and_bursts_do_not() -> None:
    lim = InputLimits(abuse_rejections_per_s=100, abuse_sustained_s=3.0)
    g = InputGuard(lim)
    t = 0.0
    for _ in range(2):  # two bad seconds, a quiet one, two bad seconds: never 3 in a row
        for _ in range(2):
            for i in range(200):
                g.rejected_action(errors.PARSE_ERROR, "x", seq=None, now_s=t + i / 200)
            t += 1.0
        t += 1.5
    assert g.verdict() is None
    for _ in range(5):
        for i in range(200):
            g.rejected_action(errors.PARSE_ERROR, "x", seq=None, now_s=t + i / 200)
        t += 1.0
    g.accepted("actions", t)
    v = g.verdict()
    assert v is not None and v["event"] == "disconnect" and v["reason"] == "flood" and "3 s" in v["message"]


@pytest.mark.parametrize("rate_hz, within_s", [(1750, 0.65), (750, 1.6), (300, 5.1)])
def test_the_faster_the_flood_the_sooner_its_verdict(rate_hz: float, within_s: float) -> None:
    """Rejections beyond 100/s add up in a leaky bucket: 1,000 of them are a flood, whatever their rate."""
    lim = InputLimits(abuse_rejections_per_s=100, abuse_sustained_s=60, abuse_burst_rejections=1000)
    g, t = InputGuard(lim), 0.0
    while g.verdict() is None:
        g.rejected_action(errors.PARSE_ERROR, "x", seq=None, now_s=t)
        t += 1 / rate_hz
        assert t < within_s, f"no verdict within {within_s} s at {rate_hz}/s"
    assert t > 1000 / rate_hz and "1000 rejected messages beyond 100/s" in g.verdict()["message"]  # type: ignore[index]
    slow = InputGuard(lim)  # 150/s: 50/s beyond the rate, 20 s to add up (the sustained rule's business)
    for i in range(150 * 10):
        slow.rejected_action(errors.PARSE_ERROR, "x", seq=None, now_s=i / 150)
    assert slow.verdict() is None


def test_refused_stream_messages_of_any_kind_are_coalesced_errors_with_their_ids() -> None:
    g = InputGuard(InputLimits(report_interval_s=0.5))
    (first,) = g.rejected_message("stream", "bad_json", "not JSON", 1.0, outcome="parse_error")
    assert first == {"event": "error", "code": "bad_json", "message": "not JSON", "count": 1,
                     "counts": {"bad_json": 1}}
    for i in range(30):
        assert g.rejected_message("stream", "rate_limited", "slow down", 1.1, outcome="rate_limited",
                                  ref={"id": f"d{i}"}, rid=f"d{i}") == []
    assert g.rejected_message("stream", "unknown_type", "?", 1.2, outcome="invalid", ref={"type": "x"}) == []
    (summary,) = g.drain(1.5)
    assert summary["count"] == 31 and summary["counts"] == {"rate_limited": 30, "unknown_type": 1}
    assert summary["id"] == "d0" and summary["ids"] == [f"d{i}" for i in range(30)]
    assert g.counts[("stream", "rate_limited")] == 30 and g.counts[("stream", "parse_error")] == 1
    rej = g.admit("stream", "x" * 5000, 2.0, max_bytes=4096)
    assert rej is not None and rej.outcome == "too_large" and "5000 bytes exceeds 4096" in rej.message


def test_a_fast_but_valid_client_is_never_judged_abusive() -> None:
    g = InputGuard()
    for i in range(6000):  # 60 s at 100 Hz, all accepted
        g.accepted("actions", i / 100)
    assert g.verdict() is None


@pytest.mark.parametrize("raw, rid", [
    ('{"id": 7, "method": ', 7), ('{"jsonrpc": "2.0", "id": "a-1", "x"', "a-1"), ('  {"id":-3}', -3),
    ('{"method": "x", "id": 1}', None), ("[1, 2]", None), (b'{"id": 12,' + b"x" * 10_000, 12), ("", None),
    ('{"id": 123456789012345678901234}', None),
])
def test_head_id_reads_a_leading_id_without_parsing(raw, rid) -> None:  # type: ignore[no-untyped-def]
    assert head_id(raw) == rid


def test_limits_validate() -> None:
    with pytest.raises(ValueError, match="report_interval_s"):
        InputLimits(report_interval_s=0)
    with pytest.raises(ValueError, match="action_rate_hz"):
        InputLimits(action_rate_hz=float("nan"))
