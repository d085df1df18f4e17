"""/metrics and admission read the engine while its device thread churns sessions: no torn reads, no errors."""

from __future__ import annotations

import asyncio
import threading

from prometheus_client import generate_latest

from worldcast.engine.admission import AdmissionConfig, AdmissionPolicy
from worldcast.engine.device_worker import EngineConfig
from worldcast.sessions.errors import CapacityExhausted
from worldcast.sessions.manager import SessionConfig, SessionManager
from worldcast.transport.http.metrics import Metrics


async def test_scrapes_and_admission_while_sessions_come_and_go(model) -> None:  # type: ignore[no-untyped-def]
    m = SessionManager(model, engine_config=EngineConfig(torch_threads=1, max_batch=4,
                                                         state_budget_bytes=model.spec.state_bytes_per_session() * 4),
                       config=SessionConfig(tick_s=3600, warmup=False,
                                            admission=AdmissionConfig(policy=AdmissionPolicy.STATIC, max_sessions=4)))
    metrics = Metrics(m)
    m.engines[0].worker.on_step, m.on_frame, m.on_admission = metrics.on_step, metrics.on_frame, metrics.on_admission
    await m.start()
    errors: list[BaseException] = []
    scrapes = [0]
    stop = threading.Event()

    def scrape() -> None:  # another thread, as a scrape under a threaded ASGI server would be
        while not stop.is_set():
            try:
                text = generate_latest(metrics.registry).decode()
                assert "worldcast_kv_pool_bytes" in text and "worldcast_device_degraded" in text
                snap = m.engines[0].worker.snapshot
                assert 0 <= snap.slots_used <= snap.slots_total and snap.used_bytes <= snap.budget_bytes
                m.engines[0].worker.active_capacity(0.85)
                scrapes[0] += 1
                stop.wait(0.002)  # hundreds of scrapes a second, and the GIL left to the device thread
            except BaseException as e:  # noqa: BLE001 - collected and re-raised below
                errors.append(e)
                return

    scrapers = [threading.Thread(target=scrape, daemon=True) for _ in range(2)]
    for t in scrapers:
        t.start()
    try:
        steps_before = m.engines[0].worker.steps_run
        created = 0
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 120
        while created < 12:
            assert loop.time() < give_up, f"only {created} sessions created"
            try:
                s = await m.create(seed=created)
                s.activate()  # as an attached client does: it generates
                created += 1
            except CapacityExhausted:  # the worker frees closed sessions' slots at its next step boundary
                await asyncio.sleep(0.05)
                continue
            m.admission_decision()  # on the loop, as POST /v1/sessions does
            await asyncio.sleep(0)
            if len(m.sessions) >= 3:  # keep two open (steps run batched) while others come and go
                m.close(next(iter(m.sessions)))
        deadline = asyncio.get_running_loop().time() + 60
        while m.engines[0].worker.steps_run < steps_before + 50 or scrapes[0] < 20:
            assert asyncio.get_running_loop().time() < deadline, (m.engines[0].worker.steps_run, scrapes[0])
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        for t in scrapers:
            t.join(10)
        await m.aclose()
    assert not errors, errors[0]
    assert created == 12 and m.engines[0].worker.alive is False
