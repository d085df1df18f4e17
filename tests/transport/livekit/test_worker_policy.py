"""The agent worker's policy without a LiveKit server: dispatch metadata and the load it reports."""

from __future__ import annotations

import pytest

pytest.importorskip("livekit.protocol")

from tests.conftest import server_config  # noqa: E402
from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy  # noqa: E402
from worldcast.sessions.manager import SessionConfig, SessionManager  # noqa: E402
from worldcast.transport.livekit.worker import FULL_LOAD, OPEN_LOAD_SCALE, DispatchMetadata, worker_load  # noqa: E402


def test_dispatch_metadata() -> None:
    assert DispatchMetadata.parse("") == DispatchMetadata()
    m = DispatchMetadata.parse('{"user_identity": "u1", "prompt": "lava", "seed": 3, "stamp_frames": true}')
    assert (m.user_identity, m.prompt, m.seed, m.stamp_frames) == ("u1", "lava", 3, True)
    for bad, needle in [("{not json", "JSON"), ('{"seed": "3"}', "seed"), ('{"extra": 1}', "extra"),
                        ('["u1"]', "body"), ('{"prompt": "a\\u0000b"}', "control character")]:
        with pytest.raises(ValueError, match=needle):
            DispatchMetadata.parse(bad)


async def test_load_follows_admission_and_stays_under_the_target_load(model) -> None:  # type: ignore[no-untyped-def]
    cfg = server_config()
    sessions = SessionConfig(warmup=False, admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=2))
    manager = SessionManager(model, engine_config=cfg.engine, config=sessions)
    await manager.start()
    try:
        assert worker_load(manager) == (True, 0.0)
        a = await manager.create(seed=1)
        assert worker_load(manager) == (True, pytest.approx(OPEN_LOAD_SCALE / 2))
        await manager.create(seed=2)
        admits, load = worker_load(manager)
        assert not admits and load == FULL_LOAD < 0.7  # livekit-server's default agents.target_load
        manager.close(a.id)
        assert worker_load(manager)[0]
    finally:
        await manager.aclose()
