"""The HTTP calls every worldcast client makes around a session: create it, delete it.

Shared by the WebRTC client (`webrtc.py`), the WebSocket stream client
(`stream.py`) and the LiveKit user (`livekit.py`) of this package.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from worldcast.transport.clients.errors import UnknownKey


def check_keys(model: Mapping[str, Any], keys: list[str]) -> None:
    """Refuse, before sending, keys outside the model's declared action space (`ModelInfo.actions.keys`).

    Raises:
        UnknownKey: names the first unknown key and the model's keys.
    """
    if isinstance(keys, str | bytes) or not all(isinstance(k, str) for k in keys):
        raise TypeError(f"keys must be a list of key names, not {keys!r}")
    known = (model.get("actions") or {}).get("keys", model.get("keys"))
    if known is None:
        return
    for k in keys:
        if k not in known:
            raise UnknownKey(f"key {k!r} is not in {model.get('name', 'the model')}'s action space {list(known)}")


def check_mouse(mouse: tuple[float, float]) -> None:
    """Refuse, before sending, a mouse movement that is not two finite numbers (counts).

    Raises:
        ValueError: not two finite numbers.
    """
    import math

    if len(mouse) != 2 or not all(isinstance(m, int | float) and not isinstance(m, bool) and math.isfinite(m)
                                  for m in mouse):
        raise ValueError(f"mouse must be two finite numbers (dx, dy counts), not {mouse!r}")


def action_message(model: Mapping[str, Any], seq: int, now_s: float, keys: list[str] | None,
                   mouse: tuple[float, float] = (0, 0), axes: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One action message (`schemas.ActionMessage`), checked before it is sent against the model's declared
    action space (`ModelInfo.actions`; an empty `model` checks only the types).

    Args:
        seq: its sequence number; now_s: send time, s (the message's `t` is ms).
        keys: keys held now; mouse: (dx, dy) counts since the previous message.
        axes: the model's axes by name (`ModelInfo.actions.axes`): movement of a relative axis, the position of
            an absolute one; left out of the message when empty, so keyboard-and-mouse messages stay as they were.

    Raises:
        UnknownKey: a key or axis the model does not declare.
        TypeError, ValueError: keys not a list of names, a mouse movement or axis value not finite, an axis value
            outside its declared range.
    """
    keys = keys or []
    check_keys(model, keys)
    check_mouse(mouse)
    msg: dict[str, Any] = {"seq": seq, "t": now_s * 1000, "keys": keys, "mouse": list(mouse)}
    if axes:
        declared = (model.get("actions") or {}).get("axes")
        ranges = None if declared is None else {a["name"]: a["range"] for a in declared}
        import math

        for name, v in axes.items():
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"axis {name!r} must be a finite number, not {v!r}")
            if ranges is not None and name not in ranges:
                raise UnknownKey(f"axis {name!r} is not in {model.get('name', 'the model')}'s axes {list(ranges)}")
            if ranges is not None and not ranges[name][0] <= v <= ranges[name][1]:
                raise ValueError(f"axis {name!r} must lie within {ranges[name]}, not {v!r}")
        msg["axes"] = dict(axes)
    return msg


def action_cycle(model: Mapping[str, Any], n: int = 4) -> list[list[str]]:
    """Single-key actions a benchmark cycles through, from the model's declared keys (its first `n`)."""
    keys = list((model.get("actions") or {}).get("keys", model.get("keys", [])))[:n]
    return [[k] for k in keys] or [[]]


async def create_session(base_url: str, *, prompt: str | None = None, seed: int | None = None,
                         stamp_frames: bool = False, image: bytes | None = None, timeout_s: float = 60.0,
                         **fields: Any) -> dict[str, Any]:
    """POST /v1/sessions and return the reply ({"session_id", "token", "model", ...}).

    Args:
        prompt, seed, stamp_frames: the common fields (omitted when None / False).
        image: a PNG or JPEG file's bytes, the starting image of a model that takes one (sent as base64).
        fields: further body fields (e.g. mode="directing", transport="livekit", room=...).

    Raises:
        httpx.HTTPStatusError: creation refused (422 naming the field for a refused prompt or image, 503 with
            Retry-After when the server is full).
    """
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if image is not None:
        body["image"] = base64.b64encode(image).decode("ascii")
    if prompt is not None:
        body["prompt"] = prompt
    if seed is not None:
        body["seed"] = seed
    if stamp_frames:
        body["stamp_frames"] = True
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
        r = await http.post("/v1/sessions", json=body)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


async def delete_session(base_url: str, session_id: str, token: str, *, timeout_s: float = 10.0) -> None:
    """DELETE /v1/sessions/{id}, ignoring transport errors (best effort, for clean-up paths)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
        with contextlib.suppress(httpx.HTTPError):
            await http.delete(f"/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {token}"})


#: Largest action seq the server accepts (`schemas.ActionMessage`: 2**53, the last integer a JSON number
#: holds exactly). A client's counter restarts at 0 before it: the server takes a seq far below its newest
#: (more than `sessions.actions.SEQ_REORDER_WINDOW` below) as a restarted numbering (docs/api.md, `actions`).
SEQ_MAX = 2**53
#: Send times kept per client (`sent_at`), at most: the oldest go first.
MAX_SENT_TIMES = 100_000


def next_seq(seq: int) -> int:
    """The seq of a client's next action message after `seq` (-1: none sent yet): seq + 1, or 0 once that
    would reach `SEQ_MAX` (a restart, which the server follows), so the server never refuses one."""
    return seq + 1 if seq + 1 < SEQ_MAX else 0


def remember_sent(sent_at: dict[int, float], seq: int, now_s: float) -> None:
    """Record when `seq` was sent, keeping at most `MAX_SENT_TIMES` (a restarted seq replaces its old time)."""
    sent_at.pop(seq, None)
    sent_at[seq] = now_s
    while len(sent_at) > MAX_SENT_TIMES:
        del sent_at[next(iter(sent_at))]


def check_rpc_payload(raw: Any) -> bool:
    """Whether a raw RPC payload is a JSON-RPC 2.0 notification (no reply will come), refusing batch objects.

    Text (str or bytes) is the caller's exact bytes, sent unchecked for error tests: a notification is
    recognised in it, a batch in it is the server's to refuse (it answers with an error and id null).

    Raises:
        ValueError: a batch object (a list): the server refuses them; send one request per message.
    """
    import json

    obj = raw
    if isinstance(raw, str | bytes):
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            return False  # not JSON: the server answers with a parse error (and the id it can read)
        return isinstance(obj, dict) and obj.get("jsonrpc") == "2.0" and "id" not in obj
    if isinstance(obj, list):
        raise ValueError("JSON-RPC batches are not supported by worldcast: send one request per message")
    return isinstance(obj, dict) and obj.get("jsonrpc") == "2.0" and "id" not in obj


class EventWaiters:
    """A client's waits for the next server message matching a predicate (event-loop only)."""

    def __init__(self) -> None:
        self._items: list[tuple[Callable[[dict[str, Any]], bool], asyncio.Future[dict[str, Any]]]] = []

    def notify(self, msg: dict[str, Any]) -> None:
        """Resolve every wait whose predicate `msg` matches."""
        for pred, fut in list(self._items):
            if not fut.done() and pred(msg):
                fut.set_result(msg)

    async def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
        """The next message matching `predicate`.

        Raises:
            TimeoutError: none within `timeout_s` (s).
        """
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        item = (predicate, fut)
        self._items.append(item)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._items.remove(item)
