"""LiveKit tokens (decoded with livekit-api's own verifier), options, and the RPC error mapping."""

from __future__ import annotations

import argparse
import time

import jwt
import pytest

pytest.importorskip("livekit.api")

from worldcast.transport import errors  # noqa: E402
from worldcast.transport.livekit import config as lkconfig  # noqa: E402
from worldcast.transport.livekit.config import LiveKitConfig, SourceKind  # noqa: E402

SECRET = "s" * 32
CFG = LiveKitConfig(url="ws://127.0.0.1:7880", api_key="key", api_secret=SECRET, user_token_ttl_s=120)


def test_user_token_is_scoped_to_its_room_and_data_only() -> None:
    from livekit import api

    from worldcast.transport.livekit.tokens import user_token

    claims = api.TokenVerifier("key", SECRET).verify(user_token(CFG, room="r1", identity="user-abc"))
    g = claims.video
    assert claims.identity == "user-abc" and g.room == "r1" and g.room_join
    assert g.can_subscribe and g.can_publish_data and not g.can_publish
    assert not g.room_admin and not g.room_create and not g.agent
    with pytest.raises(jwt.InvalidSignatureError):  # signed with our secret, not another
        api.TokenVerifier("key", "t" * 32).verify(user_token(CFG, room="r1", identity="user-abc"))


@pytest.mark.parametrize("ttl_s", [10.0, 30.0, 120.0, 3600.0])
def test_every_token_holds_nbf_now_exp_with_the_ttl_asked_for(ttl_s: float) -> None:
    """Decoded claims: nbf <= now < exp, and exp - nbf the TTL asked for (whole seconds). Before issue 31
    the user token's exp was the TTL less a minute: 50 s before nbf for a 10 s TTL."""
    import dataclasses

    from worldcast.transport.livekit.tokens import agent_token, user_token, world_token

    cfg = dataclasses.replace(CFG, user_token_ttl_s=ttl_s, world_token_ttl_s=max(ttl_s, 60.0))
    t0 = time.time()
    for tok, want in ((user_token(cfg, room="r1", identity="u"), ttl_s),
                      (world_token(cfg, room="r1", identity="w"), cfg.world_token_ttl_s),
                      (agent_token(cfg, ttl_s=ttl_s), ttl_s)):
        c = jwt.decode(tok, SECRET, algorithms=["HS256"], options={"verify_exp": False, "verify_nbf": False})
        now = time.time()
        assert c["nbf"] <= now < c["exp"], (c["nbf"], now, c["exp"])
        assert c["nbf"] <= t0 + 1 and abs((c["exp"] - c["nbf"]) - want) <= 1, (c, want)
    # a token counted as issued earlier lasts what is left of its TTL, and one past its TTL is not minted
    c = jwt.decode(user_token(cfg, room="r1", identity="u", issued_at_s=time.time() - ttl_s / 2), SECRET,
                   algorithms=["HS256"])
    assert abs((c["exp"] - c["nbf"]) - ttl_s / 2) <= 1
    with pytest.raises(ValueError, match="run out"):
        user_token(cfg, room="r1", identity="u", issued_at_s=time.time() - ttl_s - 1)


def test_world_and_agent_tokens() -> None:
    from livekit import api

    from worldcast.transport.livekit.tokens import agent_token, world_identity, world_token

    v = api.TokenVerifier("key", SECRET)
    w = v.verify(world_token(CFG, room="r1", identity=world_identity("abc")))
    assert w.identity == "worldcast-abc" and w.video.can_publish and w.video.room == "r1"
    a = v.verify(agent_token(CFG))
    assert a.video.agent and not a.video.room_join


def test_options_fall_back_on_the_environment() -> None:
    env = {"LIVEKIT_URL": "wss://lk.example", "LIVEKIT_API_KEY": "k", "LIVEKIT_API_SECRET": "s"}
    c = LiveKitConfig.from_options(None, None, None, env=env)
    assert c is not None and (c.url, c.api_key, c.api_secret) == ("wss://lk.example", "k", "s")
    assert c.http_url == "https://lk.example" and c.ws_url == "wss://lk.example"
    c = LiveKitConfig.from_options("ws://other:7880", "k2", None, env=env)
    assert c is not None and (c.url, c.api_key, c.api_secret) == ("ws://other:7880", "k2", "s")
    assert LiveKitConfig.from_options(None, None, None, env={}) is None
    with pytest.raises(ValueError, match="LIVEKIT_API_KEY"):
        LiveKitConfig.from_options("ws://x", None, None, env={})
    with pytest.raises(ValueError, match="must start with"):
        LiveKitConfig(url="ftp://x", api_key="k", api_secret="s")


def test_command_line_options() -> None:
    p = argparse.ArgumentParser()
    lkconfig.add_arguments(p)
    args = p.parse_args(["--livekit-url", "ws://h:1", "--livekit-api-key", "k", "--livekit-api-secret", "s",
                         "--livekit-source", "encoded", "--livekit-token-ttl", "60"])
    c = lkconfig.from_arguments(args, env={})
    assert c is not None and c.source == SourceKind.ENCODED and c.user_token_ttl_s == 60


def test_rpc_codes_stay_in_the_application_range() -> None:
    reserved = set(range(1501, 1506))  # the SDK's transport failures
    for ours, theirs in errors.LIVEKIT_RPC_CODE.items():
        assert 1500 <= theirs <= 1599 and theirs not in reserved, (ours, theirs)
    assert len(set(errors.LIVEKIT_RPC_CODE.values())) == len(errors.LIVEKIT_RPC_CODE)
    assert errors.livekit_rpc_code(12345) == 1500
    assert errors.LIVEKIT_FORBIDDEN not in errors.LIVEKIT_RPC_CODE.values()
