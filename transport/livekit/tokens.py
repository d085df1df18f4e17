"""Access tokens (JWTs signed with the API secret, minted by `livekit-api`) and identities.

Grants follow LiveKit's VideoGrants (livekit/protocol `auth/grants.go`):
the user may join one room, subscribe, publish data (actions) but no
media, and set its own attributes (setting one on joining makes LiveKit
announce the user to the world at once; see `world.py`); a viewer (a spectator, `sessions/viewers.py`) may
join one room hidden and subscribe, nothing else (no media, no data, no attributes: it can never act, and
the world never sees it, so it can never be taken for the user); the world may publish its video and data;
an agent worker token carries only `agent` (it may register for dispatch). Every token holds `nbf <= now < exp`, `exp`
the TTL asked for after issue; a user who joins in the server's leeway past it is removed by the world.
"""

from __future__ import annotations

import datetime
import time

from livekit import api

from worldcast.transport.livekit.config import LiveKitConfig

#: Prefixes of the participant identities a session uses.
WORLD_PREFIX, USER_PREFIX, VIEWER_PREFIX = "worldcast-", "user-", "viewer-"


def world_identity(session_id: str) -> str:
    """The identity of a session's world participant."""
    return f"{WORLD_PREFIX}{session_id}"


def user_identity(session_id: str) -> str:
    """The identity a session's user joins with, when the server mints the user's token."""
    return f"{USER_PREFIX}{session_id}"


def viewer_identity(session_id: str, viewer_id: str) -> str:
    """The identity a viewer of a session joins with (one per viewer token)."""
    return f"{VIEWER_PREFIX}{session_id}-{viewer_id}"


#: How long past its `exp` livekit-server still accepts a token, s. Measured against livekit-server v1.13.5
#: (`tests/transport/livekit/test_token_ttl.py`): a token whose exp is 58 s past joins, 59 s past is refused
#: ("token is expired"); the JWT library's one-minute default leeway, less the claims' whole-second rounding.
#: Tokens are not cut short by it (that made `exp` precede `nbf` for TTLs under a minute, issue 31): a user
#: joining past its TTL is removed by its world instead (`LiveKitWorld.join_deadline_s`).
SERVER_LEEWAY_S = 60


def user_token(config: LiveKitConfig, *, room: str, identity: str, issued_at_s: float | None = None) -> str:
    """A token for the session's user: join `room`, subscribe, publish data (no media), set its own
    attributes; valid from now until `user_token_ttl_s` after `issued_at_s`.

    Its claims hold `nbf <= now < exp` with `exp - iat` the TTL asked for (whole seconds: `livekit-api`
    writes `nbf` as the current second and `exp` as the second the TTL ends in). livekit-server still takes
    it up to `SERVER_LEEWAY_S` past `exp`; the world removes a user who joins that late.

    Args:
        issued_at_s: when it counts as issued (Unix time, s; default now): tests mint tokens "issued"
            in the past instead of waiting.

    Raises:
        ValueError: `issued_at_s` so far back that the TTL has already run out (such a token is never minted).
    """
    grants = api.VideoGrants(room_join=True, room=room, can_subscribe=True, can_publish=False,
                             can_publish_data=True, can_update_own_metadata=True)
    age = 0.0 if issued_at_s is None else time.time() - issued_at_s
    left_s = config.user_token_ttl_s - age
    if left_s < 1.0:
        raise ValueError(f"a user token issued {age:.1f} s ago with a TTL of {config.user_token_ttl_s:g} s has "
                         "run out; mint a new one")
    return (api.AccessToken(config.api_key, config.api_secret).with_identity(identity)
            .with_ttl(datetime.timedelta(seconds=left_s)).with_grants(grants).to_jwt())


def viewer_token(config: LiveKitConfig, *, room: str, identity: str, ttl_s: float) -> str:
    """A subscribe-only token for a viewer: join `room` hidden and subscribe; no media, no data, no attributes.

    Args:
        ttl_s: its lifetime, s (only joining needs it valid; the caller bounds it by the viewer token's own and
            by `user_token_ttl_s`, and removes the participant when the viewer token is revoked or runs out).

    Raises:
        ValueError: `ttl_s` under 1 s.
    """
    if ttl_s < 1.0:
        raise ValueError(f"a viewer's LiveKit token needs at least 1 s to live, got {ttl_s:g}")
    grants = api.VideoGrants(room_join=True, room=room, can_subscribe=True, can_publish=False,
                             can_publish_data=False, can_update_own_metadata=False, hidden=True)
    return (api.AccessToken(config.api_key, config.api_secret).with_identity(identity)
            .with_ttl(datetime.timedelta(seconds=ttl_s)).with_grants(grants).to_jwt())


def world_token(config: LiveKitConfig, *, room: str, identity: str, name: str = "worldcast") -> str:
    """A token for the world participant: join `room`, publish video and data, subscribe (to receive data)."""
    grants = api.VideoGrants(room_join=True, room=room, can_subscribe=True, can_publish=True,
                             can_publish_data=True, can_update_own_metadata=True)
    return (api.AccessToken(config.api_key, config.api_secret).with_identity(identity).with_name(name)
            .with_kind("agent")
            .with_ttl(datetime.timedelta(seconds=config.world_token_ttl_s)).with_grants(grants).to_jwt())


def agent_token(config: LiveKitConfig, *, ttl_s: float = 3600.0) -> str:
    """A token that lets an agent worker register (`agent` grant only)."""
    return (api.AccessToken(config.api_key, config.api_secret)
            .with_ttl(datetime.timedelta(seconds=ttl_s)).with_grants(api.VideoGrants(agent=True)).to_jwt())
