"""ICE settings of the WebRTC edge (aioice), process-wide.

- `configure_ice` pins the host addresses aioice gathers ICE candidates on;
  by default aioice skips loopback, so a server bound to 127.0.0.1 (and every
  test) pins 127.0.0.1. It also sets the consent-freshness timeout after which
  a silent peer (a killed client) is declared gone (RFC 7675).
- `close_peer_connection` closes a peer connection and releases its ICE sockets even when aiortc fails
  half-way; `quiet_closed_transport_errors` keeps aiortc's fire-and-forget tasks that
  fail after their transport closed out of asyncio's error log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aioice.ice
from aiortc import RTCPeerConnection

logger = logging.getLogger(__name__)

_original_get_host_addresses = aioice.ice.get_host_addresses

#: aioice's consent freshness defaults (RFC 7675 5.1: a check every 5 s, consent lost after 30 s).
_CONSENT_DEFAULTS = (aioice.ice.CONSENT_INTERVAL, aioice.ice.CONSENT_FAILURES)


def configure_ice(host_addresses: list[str] | None, *, consent_timeout_s: float | None = None) -> None:
    """Gather host ICE candidates only on `host_addresses` (None: aioice's default, all but loopback), and
    end a connection whose peer stopped answering ICE consent checks after about `consent_timeout_s`
    (None: RFC 7675's 30 s). A client that vanishes without closing (a killed process, a lost network)
    is noticed this way.

    Process-wide: aioice reads host addresses and consent timing from its module.
    """
    if consent_timeout_s is None:
        aioice.ice.CONSENT_INTERVAL, aioice.ice.CONSENT_FAILURES = _CONSENT_DEFAULTS
    else:
        interval = min(5.0, consent_timeout_s / 3)  # at least 3 checks before giving up
        aioice.ice.CONSENT_INTERVAL = interval  # type: ignore[assignment]  # a float works: it feeds asyncio.sleep
        aioice.ice.CONSENT_FAILURES = max(1, round(consent_timeout_s / interval))
    if host_addresses:
        addrs = list(host_addresses)
        v4 = [a for a in addrs if ":" not in a]
        v6 = [a for a in addrs if ":" in a]

        def _pinned(use_ipv4: bool, use_ipv6: bool) -> list[str]:
            return (v4 if use_ipv4 else []) + (v6 if use_ipv6 else [])

        aioice.ice.get_host_addresses = _pinned
    else:
        aioice.ice.get_host_addresses = _original_get_host_addresses


def quiet_closed_transport_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log aiortc's fire-and-forget tasks that fail because their transport already closed at INFO.

    aiortc starts some tasks with `ensure_future` and never awaits them (SCTP retransmissions, DTLS and
    ICE starts); when the peer has gone, they end in ConnectionError or InvalidStateError, which asyncio
    would report as "Task exception was never retrieved". Every other unhandled exception still goes to
    the loop's previous handler.
    """
    from aiortc.exceptions import InvalidStateError

    previous = loop.get_exception_handler()

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc, task = context.get("exception"), context.get("future")
        coro = getattr(task, "get_coro", lambda: None)()
        module = getattr(getattr(coro, "cr_code", None), "co_filename", "")
        if isinstance(exc, ConnectionError | InvalidStateError) and ("/aiortc/" in module or "/aioice/" in module):
            logger.info("aiortc task %s ended after its transport closed: %r", getattr(coro, "__qualname__", "?"),
                        exc)
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


async def close_peer_connection(pc: RTCPeerConnection) -> None:
    """`pc.close()`, and if aiortc fails half-way (it can, for a peer an odd offer left half-configured),
    stop its ICE transports anyway so their sockets are released; never raises."""
    try:
        await pc.close()
        return
    except Exception as e:  # noqa: BLE001
        logger.info("RTCPeerConnection.close failed (%r); stopping its ICE transports", e)
    for t in list(getattr(pc, "_RTCPeerConnection__iceTransports", ())):  # aiortc keeps them privately
        try:
            await t.stop()
        except Exception as e:  # noqa: BLE001
            logger.info("RTCIceTransport.stop failed: %r", e)
