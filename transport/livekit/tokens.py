"""Access tokens (JWTs signed with the API secret, minted by `livekit-api`) and identities.

Grants follow LiveKit's VideoGrants (livekit/protocol `auth/grants.go`):
the user may join one room, subscribe, publish data (actions) but no
media, and set its own attributes (setting one on joining makes LiveKit
announce the user to the world at once; see `world.py`); the world may publish its video and data; an agent worker token
carries only `agent` (it may register for dispatch).
"""

from __future__ import annotations

import datetime

from livekit import api

from worldcast.transport.livekit.config import LiveKitConfig

#: Prefixes of the participant identities a session uses.
WORLD_PREFIX, USER_PREFIX = "worldcast-", "user-"


def world_identity(session_id: str) -> str:
    """The identity of a session's world participant."""
    return f"{WORLD_PREFIX}{session_id}"


def user_identity(session_id: str) -> str:
    """The identity a session's user joins with, when the server mints the user's token."""
    return f"{USER_PREFIX}{session_id}"


def user_token(config: LiveKitConfig, *, room: str, identity: str) -> str:
    """A token for the session's user: join `room`, subscribe, publish data (no media), set its own
    attributes; valid for joining for `user_token_ttl_s`."""
    grants = api.VideoGrants(room_join=True, room=room, can_subscribe=True, can_publish=False,
                             can_publish_data=True, can_update_own_metadata=True)
    return (api.AccessToken(config.api_key, config.api_secret).with_identity(identity)
            .with_ttl(datetime.timedelta(seconds=config.user_token_ttl_s)).with_grants(grants).to_jwt())


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
