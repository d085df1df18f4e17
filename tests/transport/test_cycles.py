"""Connect/disconnect cycles of every kind (tests/cycles.py), 10 here (2 of each; `python -m tests.cycles`
runs 100): nothing leaks and every session is reaped within its stated bound."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import _serve
from tests.cycles import KINDS, cycle_config, run_cycles

pytestmark = pytest.mark.timeout(600)


def test_every_way_of_leaving_frees_everything_within_its_bound(model) -> None:  # type: ignore[no-untyped-def]
    gen = _serve(cycle_config(), model)
    srv = next(gen)
    try:
        rep = asyncio.run(run_cycles(srv, 2 * len(KINDS)))
    finally:
        gen.close()
    assert rep.cycles == 10 and set(rep.kinds) == set(KINDS)
    assert rep.late == [], rep.late
    assert rep.leaks == {k: 0 for k in rep.leaks} and set(rep.leaks) >= {"fds", "threads", "server_tasks", "peers",
                                                                          "peer_connections", "sessions"}, (
        rep.leaks, rep.fd_targets)
    assert rep.task_errors == [], rep.task_errors
    assert all(len(v) == 2 for v in rep.reap_s.values()), rep.reap_s
