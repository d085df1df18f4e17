"""Access: what a bearer token opens on a session, checked in one place (`authorize`) for every surface.

Every route and every stream asks `authorize` (HTTP: `transport/http/routes/deps.py`; the worldcast stream:
`transport/stream/connection.py`; WHEP: `transport/http/routes/whep.py`); the caller's role (`Access.viewer`
None: the session's controller) decides what it may do. A viewer token is minted and kept by the session's
`Viewers` (`sessions/viewers.py`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from worldcast.sessions.session import Session, SessionState
from worldcast.sessions.viewers import Viewer

#: Compared against when the id is unknown or closed, so that every refusal takes the same time.
_NO_TOKEN = secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Access:
    """What a token opens: its session, and the viewer it belongs to (None: the session's own token, its owner's)."""

    session: Session
    viewer: Viewer | None = None

    @property
    def owner(self) -> bool:
        """Whether the token is the session's own: it may always take control back (`Session.hand_over`)."""
        return self.viewer is None

    @property
    def controller(self) -> bool:
        """Whether the token holds control now (it may act, direct, flush, cancel, create viewers): the owner's,
        unless it handed control to a viewer, whose token then does."""
        held = self.session.controller_viewer
        return held is None if self.viewer is None else self.viewer.viewer_id == held


def count_spectators(sessions: Iterable[Session]) -> int:
    """Live spectator streams over `sessions`, each counted by its weight (`Spectator.weight`: 1, or more for one
    with an encode of its own); derived each time: the sessions' own records are the fact."""
    return sum(sp.weight for s in sessions for sp in s.viewers.spectators)


def authorize(sessions: Mapping[str, Session], session_id: str, token: str) -> Access | None:
    """What `token` opens on session `session_id`: the controller's access, a viewer's, or nothing.

    The one check of a session's bearer token (HTTP routes, the worldcast stream, WHEP). An unknown or
    closed id is compared against a throwaway token, so every refusal takes the same path.

    Returns:
        None for an unknown or closed id, or a token that is neither the session's nor one of its live
        viewers'.
    """
    session = sessions.get(session_id)
    open_ = session is not None and session.state != SessionState.CLOSED
    expected = session.token if open_ else _NO_TOKEN  # type: ignore[union-attr]
    is_controller = secrets.compare_digest(token.encode(), expected.encode())
    if not open_:
        return None
    assert session is not None
    if is_controller:
        return Access(session)
    viewer = session.viewers.find(token)
    return None if viewer is None else Access(session, viewer)


def token_opens_any(sessions: Mapping[str, Session], token: str) -> bool:
    """Whether `token` opens some open session (its own or one of its live viewers'): WHEP tells such a
    caller 404 for an id its token does not open, and anyone else 401 (`transport/http/routes/whep.py`)."""
    return any(authorize(sessions, sid, token) is not None for sid in list(sessions))
