"""A worldcast server wired to the real test LiveKit server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import LiveServer, _serve, server_config


def livekit_config(lk, **kw):  # type: ignore[no-untyped-def]
    from worldcast.transport.livekit.config import LiveKitConfig

    return LiveKitConfig(url=lk.url, api_key=lk.api_key, api_secret=lk.api_secret, **kw)


@pytest.fixture(scope="module")
def lk_server(model, livekit_server) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    """A worldcast server (shipped model) whose LiveKit sessions join `livekit_server`."""
    yield from _serve(server_config(livekit=livekit_config(livekit_server)), model)
