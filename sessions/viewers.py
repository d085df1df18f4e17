"""Viewers: a session's view-only credentials and its spectators, and the one check of every session token.

A session's controller holds the session's token (`Session.token`) and may do everything; a *viewer*
holds a viewer token the controller issued (`Viewers.issue`) and may only watch. A viewer token is
revocable (`Viewers.revoke`) and lives at most its TTL; when it is revoked or runs out, every stream
opened with it is closed. A *spectator* is one live view-only stream of the session (a WHEP peer, a
read-only fMP4 stream), whatever token opened it; spectators are admitted against caps per session and
per server (`Viewers.admit`) and released when they leave (`Spectator.leave`). The server's cap is a CPU
budget: by default `SPECTATOR_CPU_SHARE` of the machine's cores at the measured cost of one spectator that
shares its session's encode (`SPECTATOR_COST_CORES`, `spectator_cap`); a spectator with an encode of its own
(a WHEP player that offered only VP8) counts for as many as it costs (`Spectator.weight`).

`sessions/access.py` (`authorize`) is the one place a token is checked against a session.

Event loop only (expiry timers run on the running loop, when there is one).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from worldcast.sessions.errors import SpectatorRefused, ViewerRefused

logger = logging.getLogger(__name__)

#: What a spectator watches through.
SpectatorKind = Literal["whep", "fmp4"]

#: What one spectator stream costs the server process, in cores (CPU-seconds per second), by how its video is
#: made, from `python -m worldcast.latency_bench.spectators` (BENCHMARKS.md, "Spectators": TinyWorld at 20 fps,
#: the 2-vCPU development VM): "shared", an fMP4 stream or a WHEP peer playing the session's one H.264 encode
#: (measured 0.001 a fMP4 spectator and 0.002 a WHEP one over 16; rounded up to 0.005, the measurement's noise
#: being of that size); "own_encode", a WHEP peer that offered only VP8 (aiortc encodes for it alone: measured
#: 0.04 for one).
SPECTATOR_COST_CORES = {"shared": 0.005, "own_encode": 0.04}
#: Share of the machine's cores that spectators may cost together by default (the rest is the sessions': the
#: engine, the controllers' streams, the encodes).
SPECTATOR_CPU_SHARE = 0.25


def spectator_cap(cores: int, *, share: float = SPECTATOR_CPU_SHARE,
                  cost_cores: float = SPECTATOR_COST_CORES["shared"]) -> int:
    """Spectators sharing their sessions' encodes that fit in `share` of `cores` at `cost_cores` each (>= 1).

    Args:
        cores: CPU cores of the machine (`os.cpu_count()`).
        share: of those cores, the part spectators may take, in (0, 1].
        cost_cores: one spectator's cost, cores (CPU-seconds per second).
    """
    if cores < 1 or not 0 < share <= 1 or not 0 < cost_cores < float("inf"):
        raise ValueError(f"spectator_cap: need cores >= 1, share in (0, 1], cost_cores > 0; got {cores}, "
                         f"{share:g}, {cost_cores:g}")
    return max(1, math.floor(cores * share / cost_cores + 1e-9))


def own_encode_weight() -> int:
    """How many spectators sharing an encode one with an encode of its own counts for (their cost's ratio)."""
    return max(1, math.ceil(SPECTATOR_COST_CORES["own_encode"] / SPECTATOR_COST_CORES["shared"] - 1e-9))


@dataclass(frozen=True)
class ViewerConfig:
    """Caps and lifetimes of viewer tokens and spectators.

    Attributes:
        default_ttl_s: a viewer token's lifetime when none is asked for, s.
        min_ttl_s, max_ttl_s: the lifetimes one may ask for, s.
        max_tokens_per_session: live (unrevoked, unexpired) viewer tokens of one session.
        max_spectators_per_session: live spectator streams of one session (WHEP and fMP4 together).
        max_spectators: the whole server's spectators, each counted by its `Spectator.weight` (1 for one that
            shares its session's encode); None: derived from the measured cost, `spectator_cap(cpu_cores)`.
        cpu_cores: the machine's cores the derived cap budgets (None: `os.cpu_count()`).
        retry_after_s: the `Retry-After` of a refusal for the server's cap, s (a spectator leaving is not
            scheduled: a hint, not a promise).
        stall_s: a spectator's fMP4 stream whose reader has taken nothing for this long while media waits
            is dropped, s.
    """

    default_ttl_s: float = 3600.0
    min_ttl_s: float = 10.0
    max_ttl_s: float = 86400.0
    max_tokens_per_session: int = 32
    max_spectators_per_session: int = 16
    max_spectators: int | None = None
    cpu_cores: int | None = None
    retry_after_s: float = 10.0
    stall_s: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.min_ttl_s <= self.max_ttl_s < float("inf"):
            raise ValueError(f"ViewerConfig: need 0 < min_ttl_s <= max_ttl_s < inf, got {self.min_ttl_s:g} and "
                             f"{self.max_ttl_s:g}")
        if not self.min_ttl_s <= self.default_ttl_s <= self.max_ttl_s:
            raise ValueError(f"a viewer token's default TTL (default_ttl_s, --viewer-ttl) must lie in "
                             f"[{self.min_ttl_s:g}, {self.max_ttl_s:g}] s, got {self.default_ttl_s:g}")
        for name in ("max_tokens_per_session", "max_spectators_per_session", "max_spectators"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= 100_000:
                raise ValueError(f"ViewerConfig.{name} must lie in [0, 100000]")
        if self.cpu_cores is not None and not 1 <= self.cpu_cores <= 100_000:
            raise ValueError("ViewerConfig.cpu_cores must lie in [1, 100000]")
        if not 0 < self.stall_s < float("inf") or not 0 < self.retry_after_s < float("inf"):
            raise ValueError("ViewerConfig: stall_s and retry_after_s must be positive and finite")

    @property
    def server_cap(self) -> int:
        """The server's spectator cap: `max_spectators`, or the one derived from the measured cost."""
        if self.max_spectators is not None:
            return self.max_spectators
        return spectator_cap(self.cpu_cores or os.cpu_count() or 1)

    @property
    def server_cap_basis(self) -> str:
        """Where `server_cap` comes from, in words (refusals and logs quote it)."""
        if self.max_spectators is not None:
            return "as configured (--max-spectators)"
        cores = self.cpu_cores or os.cpu_count() or 1
        return (f"{SPECTATOR_CPU_SHARE:.0%} of {cores} cores at {SPECTATOR_COST_CORES['shared']:g} cores a "
                f"spectator, measured; one with an encode of its own counts {own_encode_weight()}")


@dataclass(eq=False)
class Spectator:
    """One live view-only stream of a session.

    Attributes:
        kind: "whep" or "fmp4".
        viewer_id: the viewer token that opened it (None: the session's own token).
        close: closes the stream, with the reason ("revoked", "expired", "session_closed"); must not block.
        weight: what it counts for against the server's cap: 1 while it shares its session's encode,
            `own_encode_weight()` once it has an encode of its own (set by its transport).
    """

    kind: SpectatorKind
    viewer_id: str | None
    close: Callable[[str], None]
    weight: int = 1
    _owner: Viewers | None = field(default=None, repr=False)

    def leave(self) -> None:
        """The stream ended: release its place (idempotent)."""
        if self._owner is not None:
            self._owner.spectators.discard(self)
            self._owner = None


@dataclass(eq=False)
class Viewer:
    """One viewer token.

    Attributes:
        viewer_id: public id (for `DELETE /v1/sessions/{id}/viewers/{viewer_id}`).
        token: the bearer secret.
        expires_at_s: when it runs out, on the session's clock (monotonic), s.
        on_revoke: called with the reason ("revoked", "expired", "session_closed") once it is revoked, after its
            streams are closed (what else it opened: a LiveKit viewer's place in the room); must not block.
    """

    viewer_id: str
    token: str
    expires_at_s: float
    on_revoke: list[Callable[[str], None]] = field(default_factory=list, repr=False)
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Viewers:
    """One session's viewer tokens and spectators. Held by its `Session` (`Session.viewers`).

    Args:
        session_id: for logs.
        clock: the session's monotonic clock, s.
    """

    def __init__(self, session_id: str, *, clock: Callable[[], float]) -> None:
        self.session_id = session_id
        self.clock = clock
        self.tokens: dict[str, Viewer] = {}  #: live viewer tokens by viewer id
        self.spectators: set[Spectator] = set()  #: live spectator streams
        self.closed = False

    def __len__(self) -> int:
        return len(self.tokens)

    def issue(self, config: ViewerConfig, *, ttl_s: float | None = None) -> Viewer:
        """Mint a viewer token, valid for `ttl_s` (default `config.default_ttl_s`), s.

        Raises:
            ValueError: `ttl_s` outside [min_ttl_s, max_ttl_s].
            ViewerRefused: the session is closed, or already has `max_tokens_per_session` live tokens.
        """
        ttl = config.default_ttl_s if ttl_s is None else ttl_s
        if not config.min_ttl_s <= ttl <= config.max_ttl_s:
            raise ValueError(f"ttl_s must lie in [{config.min_ttl_s:g}, {config.max_ttl_s:g}] s, got {ttl:g}")
        if self.closed:
            raise ViewerRefused(f"session {self.session_id} is closed")
        self.expire()
        if len(self.tokens) >= config.max_tokens_per_session:
            raise ViewerRefused(f"this session has {len(self.tokens)} live viewer tokens, the most it may have "
                                "(DELETE one, or let one expire)")
        v = Viewer(viewer_id=f"v{secrets.token_hex(6)}", token=secrets.token_urlsafe(24),
                   expires_at_s=self.clock() + ttl)
        try:
            v._timer = asyncio.get_running_loop().call_later(ttl, self.revoke, v.viewer_id, "expired")
        except RuntimeError:  # no running loop: `find` still refuses it once it has run out
            pass
        self.tokens[v.viewer_id] = v
        logger.info("Session(%s): viewer %s issued (ttl %.0f s)", self.session_id, v.viewer_id, ttl)
        return v

    def revoke(self, viewer_id: str, reason: str = "revoked") -> bool:
        """Withdraw a viewer token and close every stream it opened (idempotent).

        Returns:
            False if no live token has that id.
        """
        v = self.tokens.pop(viewer_id, None)
        if v is None:
            return False
        if v._timer is not None:
            v._timer.cancel()
        for sp in [sp for sp in self.spectators if sp.viewer_id == viewer_id]:
            sp.leave()
            try:
                sp.close(reason)
            except Exception:  # noqa: BLE001 - one stream's bug must not keep the others open
                logger.exception("Session(%s): closing a spectator of viewer %s failed", self.session_id, viewer_id)
        for cb in v.on_revoke:
            try:
                cb(reason)
            except Exception:  # noqa: BLE001
                logger.exception("Session(%s): a revocation listener of viewer %s failed", self.session_id, viewer_id)
        logger.info("Session(%s): viewer %s %s", self.session_id, viewer_id, reason)
        return True

    def expire(self) -> None:
        """Revoke every token that has run out (their timers do it too; this covers a loop that was late)."""
        now = self.clock()
        for vid in [vid for vid, v in self.tokens.items() if v.expires_at_s <= now]:
            self.revoke(vid, "expired")

    def find(self, token: str) -> Viewer | None:
        """The live viewer whose token this is (compared in constant time with each; None: none)."""
        now, found = self.clock(), None
        for v in list(self.tokens.values()):
            if secrets.compare_digest(token.encode(), v.token.encode()) and v.expires_at_s > now:
                found = v
        return found

    def admit(self, config: ViewerConfig, *, kind: SpectatorKind, viewer: Viewer | None,
              close: Callable[[str], None], server_spectators: int) -> Spectator:
        """Admit one spectator stream against the caps.

        Args:
            viewer: the viewer whose token opened it (None: the session's own token).
            close: closes the stream (see `Spectator.close`).
            server_spectators: live spectators on the whole server now, each by its weight (`count_spectators`).

        Raises:
            SpectatorRefused: `scope` "session" (this session's cap) or "server" (the server's); or the
                viewer's token was revoked meanwhile.
        """
        if self.closed or (viewer is not None and self.tokens.get(viewer.viewer_id) is not viewer):
            raise SpectatorRefused("the viewer token was revoked or has run out", scope="session")
        if len(self.spectators) >= config.max_spectators_per_session:
            raise SpectatorRefused(f"this session has {len(self.spectators)} spectators, the most it takes "
                                   f"({config.max_spectators_per_session})", scope="session")
        cap = config.server_cap
        if server_spectators >= cap:
            raise SpectatorRefused(f"the server has {server_spectators} spectators, the most it takes ({cap}: "
                                   f"{config.server_cap_basis})", scope="server", retry_after_s=config.retry_after_s)
        sp = Spectator(kind, None if viewer is None else viewer.viewer_id, close, _owner=self)
        self.spectators.add(sp)
        return sp

    def close(self) -> None:
        """The session closed: revoke every token and close every spectator (idempotent)."""
        self.closed = True
        for vid in list(self.tokens):
            self.revoke(vid, "session_closed")
        for sp in list(self.spectators):
            sp.leave()
            try:
                sp.close("session_closed")
            except Exception:  # noqa: BLE001
                logger.exception("Session(%s): closing a spectator failed", self.session_id)
