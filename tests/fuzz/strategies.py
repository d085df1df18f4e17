"""Hypothesis strategies for every input surface: action messages, control RPCs, SDP offers.

Each strategy mixes near-valid messages (one field wrong, a wild value) with
arbitrary JSON, text and bytes, so both the parser's edges and its deep paths
are reached. Messages come out as the wire carries them (str or bytes).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

KEYS = ["w", "a", "s", "d", "space", "shift"]
METHODS = ["flush", "cancel", "set_prompt", "pause", "resume", "get_state"]

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=24,
)


def _dumps(obj: Any, *, ascii_only: bool) -> str:
    return json.dumps(obj, ensure_ascii=ascii_only, allow_nan=True)


@st.composite
def _encoded(draw: st.DrawFn, obj: Any) -> str | bytes:
    """One JSON value as the wire may carry it: ASCII-escaped or UTF-8 text, or bytes."""
    how = draw(st.sampled_from(["ascii", "utf8", "bytes"]))
    if how == "ascii":
        return _dumps(obj, ascii_only=True)
    text = _dumps(obj, ascii_only=False)
    if how == "bytes":
        return text.encode("utf-8", "surrogatepass")
    return text


seqs = (st.integers(min_value=0, max_value=400) | st.integers(min_value=-3, max_value=2**54)
        | st.sampled_from([2**53, 2**53 + 1, -1]) | st.floats() | st.text(max_size=5) | st.none())
mice = (st.tuples(st.integers(-20_000, 20_000), st.integers(-20_000, 20_000)).map(list)
        | st.lists(st.floats(), max_size=3) | json_values)
action_dicts = st.fixed_dictionaries(
    {"seq": seqs, "t": st.floats(min_value=-1, max_value=1e9) | st.integers(-5, 10**9) | json_scalars},
    optional={
        "keys": st.lists(st.sampled_from(KEYS + ["fly", "", "W", "\u0000"]), max_size=20) | json_values,
        "mouse": mice,
        "extra": json_values,
    },
)


def _deep(n: int) -> str:
    return "[" * n + "]" * n


#: Messages for the `actions` data channel.
action_messages = st.one_of(
    action_dicts.flatmap(_encoded),
    action_dicts.flatmap(_encoded),  # weighted: most cases near the schema
    json_values.flatmap(_encoded),
    st.text(max_size=200),
    st.binary(max_size=200),
    st.integers(1, 3000).map(_deep),
    st.integers(1000, 6000).map(lambda n: json.dumps({"seq": 1, "t": 0, "keys": ["w"] * n})),
)

ids = (st.integers(-(2**54), 2**54) | st.text(max_size=70) | st.none() | st.booleans() | st.floats()
       | st.lists(st.integers(), max_size=2))
prompts = st.text(min_size=0, max_size=520) | st.sampled_from(["a snowy landscape", "\U0001f30b" * 500, " ",
                                                               "a\u202eb", "\ud800", "lava\x00"])
params = st.one_of(
    st.just({}), st.fixed_dictionaries({"prompt": prompts}), st.fixed_dictionaries({"prompt": json_values}),
    st.dictionaries(st.text(max_size=10), json_values, max_size=3), json_values,
)
rpc_dicts = st.fixed_dictionaries(
    {"method": st.sampled_from(METHODS) | st.text(max_size=70) | json_scalars},
    optional={"id": ids, "params": params, "jsonrpc": st.sampled_from(["2.0", "1.0", "2", None, 2.0]),
              "extra": json_values},
)

#: Messages for the `control` data channel and bodies for POST /v1/sessions/{id}/rpc.
control_messages = st.one_of(
    rpc_dicts.flatmap(_encoded),
    rpc_dicts.flatmap(_encoded),
    st.lists(rpc_dicts, min_size=0, max_size=3).flatmap(_encoded),  # batches
    json_values.flatmap(_encoded),
    st.text(max_size=200),
    st.binary(max_size=200),
    st.integers(1, 3000).map(_deep),
    st.integers(4000, 9000).map(lambda n: json.dumps({"id": 5, "method": "set_prompt", "params": {"prompt": "x" * n}})),
)

_PROTOS = ["UDP/TLS/RTP/SAVPF", "RTP/AVP", "RTP/SAVP", "UDP/DTLS/SCTP", "DTLS/SCTP", "TCP/TLS/RTP/SAVPF", "x"]
_ATTRS = ["a=fingerprint:sha-256 00:11", "a=ice-ufrag:ab", "a=ice-pwd:x", "a=setup:holdconn", "a=sendonly",
          "a=inactive", "a=candidate:1 1 udp 1 10.0.0.1 9 typ host", "a=bundle-only", "m=video 0 RTP/AVP 0",
          "m=audio 9 UDP/TLS/RTP/SAVPF 0", "a=rtpmap:97 H265/90000", "a=mid:", "c=IN IP6 ::1", "a=group:BUNDLE 7"]


@st.composite
def sdp_offers(draw: st.DrawFn, bases: list[str]) -> str:
    """A real offer (one of `bases`) with a few mutations: lines dropped, duplicated, rewritten, inserted,
    profiles swapped, truncated; or arbitrary text."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.text(max_size=300))
    lines = draw(st.sampled_from(bases)).split("\r\n")
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["drop", "dup", "rewrite", "insert", "proto", "truncate", "token", "none"]))
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        if op == "drop" and lines:
            del lines[i]
        elif op == "dup" and lines:
            lines.insert(i, lines[i])
        elif op == "rewrite" and lines:
            lines[i] = lines[i][:2] + draw(st.text(max_size=60))
        elif op == "insert":
            lines.insert(i, draw(st.sampled_from(_ATTRS) | st.text(max_size=40)))
        elif op == "proto":
            old, new = draw(st.sampled_from(_PROTOS)), draw(st.sampled_from(_PROTOS))
            lines = [x.replace(old, new) for x in lines]
        elif op == "truncate":
            text = "\r\n".join(lines)
            lines = text[: draw(st.integers(0, len(text)))].split("\r\n")
        elif op == "token" and lines:
            parts = lines[i].split(" ")
            j = draw(st.integers(0, len(parts) - 1))
            parts[j] = draw(st.text(max_size=12) | st.sampled_from(["0", "-1", "99999999999", "sha-1", ""]))
            lines[i] = " ".join(parts)
    sep = draw(st.sampled_from(["\r\n", "\n"]))
    return sep.join(lines)
