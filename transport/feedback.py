"""InputFeedback: what a transport sends back for a client's input, coalesced, and its flood verdict.

`InputGuard` (`limits.py`) decides; this object does the sending for one
connection, the same way on every transport (WebRTC data channels, the
WebSocket stream, LiveKit data packets):

- events a message produced go out at once (`send_all`);
- rejections the guard coalesced go out as one summary per interval, from a
  timer armed on the event loop when one is pending (`guard.next_drain_s`);
- once the guard says the client floods (`guard.verdict()`), the pending
  summaries and the `disconnect` event are sent, `on_flood` is called once,
  and no further input is taken (`closed`).

Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from worldcast.transport.limits import InputGuard

logger = logging.getLogger(__name__)


class InputFeedback:
    """Coalesced feedback and the flood verdict for one client connection.

    Args:
        guard: the connection's input guard.
        send: sends one event to the client (must not block).
        on_flood: called once with the verdict event after it was sent (close the connection, or stop
            taking the client's input where the transport cannot close it).
        clock: monotonic clock, s.
    """

    def __init__(self, guard: InputGuard, *, send: Callable[[dict[str, Any]], None],
                 on_flood: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.guard, self._send, self._on_flood, self._clock = guard, send, on_flood, clock
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False  #: a flood verdict was given (or `close` was called): take no more input

    def send_all(self, events: list[dict[str, Any]]) -> None:
        """Send `events` now, then arm the summary timer or give the flood verdict."""
        if self.closed:
            return
        for ev in events:
            self._send(ev)
        verdict = self.guard.verdict()
        if verdict is not None:
            self.closed = True
            self._cancel()
            for ev in self.guard.drain(float("inf")):
                self._send(ev)
            self._send(verdict)
            self._on_flood(verdict)
            return
        due = self.guard.next_drain_s
        if due is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, due - self._clock()), self._drain)

    def _drain(self) -> None:
        self._timer = None
        if not self.closed:
            self.send_all(self.guard.drain(self._clock()))

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Stop: no timer, no further events (idempotent)."""
        self.closed = True
        self._cancel()
