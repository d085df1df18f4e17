"""Limits on raw HTTP connections, below ASGI: a request-head timeout and connections per client.

uvicorn (0.30) bounds idle keep-alive connections (`timeout_keep_alive`, armed
after a response) and the app's concurrency (`limit_concurrency`, all clients
together), but not the time a client takes to send a request's head: a client
that sends its headers one byte a second holds a connection, a file descriptor
and a parser for as long as it likes, and nothing stops one address from
opening hundreds of them (the slowloris attack). ASGI middleware cannot help:
the app sees a request only once its head is complete. So the guard is a
subclass of uvicorn's own HTTP protocol (`uvicorn.Config(http=...)` takes a
class), built by `guarded_http_protocol`:

- **head timeout**: from the connection's first moment, and again from the
  first byte of each later request on a kept-alive connection, the request's
  head (request line and headers) must be complete within
  `head_timeout_s`; else `408 Request Timeout` (RFC 9110 15.5.9) and close.
  A WebSocket upgrade is complete once its head is; its frames are then the
  WebSocket protocol's business (its own ping timeouts);
- **head size**: more than `max_head_bytes` received without a complete head
  is `431 Request Header Fields Too Large` (RFC 6585 5) and close (httptools,
  uvicorn's default parser, sets no limit of its own; a body arriving with its
  head in one read does not count);
- **per client**: at most `max_per_client` open connections (HTTP and
  WebSocket alike) from one remote address; past that a new one gets `503`
  and is closed at once. Behind a reverse proxy every client shares the
  proxy's address: raise the limit there, or set it to 0 (off).

`serve_config` builds the whole `uvicorn.Config` the way `worldcast serve`
runs it, so the tests run the same server.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

#: The responses the guard writes itself (the app never sees these connections).
_RESPONSES = {
    408: b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    503: b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n",
}


@dataclass(frozen=True)
class ConnectionLimits:
    """Raw connection limits of one server (see the module docstring)."""

    head_timeout_s: float = 10.0  #: a request's head must arrive within this, s (None-like: 0 turns it off)
    max_head_bytes: int = 64 * 1024  #: largest request head, bytes
    max_per_client: int = 64  #: open connections per remote address (0: no limit)

    def __post_init__(self) -> None:
        if not 0 <= self.head_timeout_s < float("inf"):
            raise ValueError("head_timeout_s must be >= 0 and finite (0: off)")
        if self.max_head_bytes < 1024:
            raise ValueError("max_head_bytes must be >= 1024")
        if self.max_per_client < 0:
            raise ValueError("max_per_client must be >= 0 (0: no limit)")


@dataclass
class GuardStats:
    """What the guard refused (read by tests and `make attack`)."""

    head_timeouts: int = 0
    heads_too_large: int = 0
    over_client_limit: int = 0
    #: open transports by remote address (pruned of closed ones as connections come and go)
    open_by_client: dict[str, list[asyncio.BaseTransport]] = field(default_factory=dict)

    _seen: int = 0

    def open_count(self, addr: str) -> int:
        """Open connections from `addr` (and, every 1024 calls, forget addresses with none open)."""
        self._seen += 1
        if self._seen % 1024 == 0:
            for a in list(self.open_by_client):
                if a != addr:
                    self.open_count(a)
        live = [t for t in self.open_by_client.get(addr, []) if not t.is_closing()]
        if live:
            self.open_by_client[addr] = live
        else:
            self.open_by_client.pop(addr, None)
        return len(live)


def _base_protocol() -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, else its h11 one (both keep `transport`, `cycle`, `data_received`)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol  # type: ignore[no-any-return]
    except ImportError:  # no httptools: uvicorn's pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol  # type: ignore[no-any-return]


def guarded_http_protocol(limits: ConnectionLimits, stats: GuardStats | None = None) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol that enforces `limits` (pass it as `uvicorn.Config(http=...)`).

    Args:
        stats: where refusals and open connections are counted (a new one if None; read it back
            as the class attribute `stats`).
    """
    base: Any = _base_protocol()
    shared = stats if stats is not None else GuardStats()

    class GuardedHttpProtocol(base):  # type: ignore[misc, valid-type]
        stats = shared

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._head_timer: asyncio.TimerHandle | None = None
            self._head_bytes = 0
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            addr = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            if limits.max_per_client and shared.open_count(addr) >= limits.max_per_client:
                shared.over_client_limit += 1
                self._refuse(503)
                return
            shared.open_by_client.setdefault(addr, []).append(transport)
            self._arm()

        def _arm(self) -> None:
            self._head_bytes = 0
            if limits.head_timeout_s > 0 and self._head_timer is None:
                self._head_timer = asyncio.get_running_loop().call_later(limits.head_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _waiting_for_head(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or cycle.response_complete

        def _refuse(self, status: int) -> None:
            self._disarm()
            t = self.transport
            if t is not None and not t.is_closing():
                t.write(_RESPONSES[status])
                t.close()

        def _timed_out(self) -> None:
            self._head_timer = None
            t = self.transport
            if t is None or t.is_closing() or t.get_protocol() is not self or not self._waiting_for_head():
                return
            shared.head_timeouts += 1
            self._refuse(408)

        def data_received(self, data: bytes) -> None:
            waiting = self._waiting_for_head()
            if waiting:
                if self._head_timer is None:  # the first byte of a kept-alive connection's next request
                    self._arm()
                self._head_bytes += len(data)
            super().data_received(data)
            upgraded = self.transport is not None and self.transport.get_protocol() is not self
            if upgraded or not self._waiting_for_head():
                self._disarm()  # the head is in (a request is being served, or the socket is a WebSocket)
            elif waiting and self._head_bytes > limits.max_head_bytes:  # still no complete head: too large
                shared.heads_too_large += 1
                self._refuse(431)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttpProtocol


def serve_config(app: Any, *, host: str, port: int, limits: ConnectionLimits, log_level: str = "info",
                 stats: GuardStats | None = None) -> Any:
    """The `uvicorn.Config` of a worldcast server: the guarded HTTP protocol, WebSocket settings.

    Video is already compressed (no permessage-deflate); client WebSocket messages are small
    (1 MiB cap, far above `stream/connection.MAX_TEXT_BYTES`: a larger frame closes the socket).
    """
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=guarded_http_protocol(limits, stats),
                          ws_per_message_deflate=False, ws_max_size=1 << 20)
