"""Moving sessions between engine cores at a chunk boundary, and draining an engine.

A move captures the session's whole engine-side state on its engine at the
session's next chunk boundary (`engine/session_state.py`: its pool slot,
rollout counters, RNG state, schedule and conditioner), which detaches it
there, and restores the same bytes on the target. The next chunk continues
the scene: its latents are drawn from the moved RNG state and attend over
the moved KV ring, and its deadline is the one the session had, so PTS go
on from where they were (`MediaClock`) with no regression. Input changes
that arrive while the session is between engines are held
(`SessionManager.moving`) and replayed onto the target in order.

What a move costs the moved session's stream: the time from its boundary
on the source to its first step on the target (capture, transfer, restore),
measured in BENCHMARKS.md. Other sessions on either engine are not paused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worldcast.engine.engine_handle import EngineHandle
from worldcast.engine.errors import EngineUnavailable
from worldcast.sessions.errors import MoveFailed, SessionNotFound
from worldcast.sessions.session import CloseReason, Session, SessionState

if TYPE_CHECKING:
    from worldcast.sessions.manager import SessionManager

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveReport:
    """One completed move.

    Attributes:
        session_id: the session.
        source, target: engine ids.
        state_bytes: bytes of its captured state.
        export_ms: from the request to the captured state on this side (includes waiting for the chunk
            in flight to commit), ms.
        import_ms: from the captured state to the session restored on the target, ms.
        identical: with `verify`, whether the target's state, captured again right after the restore,
            is byte-identical to what left the source (None: not checked).
    """

    session_id: str
    source: int
    target: int
    state_bytes: int
    export_ms: float
    import_ms: float
    identical: bool | None = None

    def info(self) -> dict[str, object]:
        return {"session_id": self.session_id, "from": self.source, "to": self.target,
                "state_bytes": self.state_bytes, "export_ms": round(self.export_ms, 2),
                "import_ms": round(self.import_ms, 2), "identical": self.identical}


@dataclass(frozen=True)
class DrainReport:
    """What draining an engine did."""

    engine_id: int
    moved: list[MoveReport] = field(default_factory=list)
    stayed: dict[str, str] = field(default_factory=dict)  #: session id -> why it could not move


def _target(m: SessionManager, src: EngineHandle, to: int | None) -> EngineHandle:
    if to is None:
        p = m.placement(exclude=src)
        if p.engine is None:
            raise MoveFailed(f"no other engine can take it ({p.decision.reason}); it stays on engine {src.id}")
        return p.engine
    target = m.engine(to)
    if target is src:
        raise MoveFailed(f"the session is on engine {to} already")
    if not target.ready:
        raise MoveFailed(f"engine {to} is {target.state}; the session stays on engine {src.id}")
    if target.draining:
        raise MoveFailed(f"engine {to} is draining (undrain it first); the session stays on engine {src.id}")
    if target.free_slots < 1:
        raise MoveFailed(f"engine {to} has no free state slot; the session stays on engine {src.id}")
    return target


async def move_session(m: SessionManager, session_id: str, *, to: int | None = None,
                       verify: bool = False) -> MoveReport:
    """Move one session to engine `to` (None: where placement puts it) at its next chunk boundary.

    A move, once begun, finishes even if the caller is cancelled (an HTTP client that went away):
    a session left between two engines would generate nowhere.

    Args:
        verify: also capture its state on the target right after the restore and compare the bytes.

    Raises:
        SessionNotFound: no such open session (or it closed while moving).
        EngineNotFound: no engine `to`.
        MoveFailed: no target can take it (it stays where it is), or the target failed it after it
            left the source (it is then closed with an error).
    """
    s = m.get(session_id)
    src = m.engine_of(session_id)
    if src is None:
        raise SessionNotFound(f"no session {session_id!r}")
    if session_id in m.moving:
        raise MoveFailed(f"session {session_id} is moving already")
    target = _target(m, src, to)
    m.moving[session_id] = []
    task = asyncio.get_running_loop().create_task(_move(m, s, src, target, verify=verify),
                                                  name=f"move-{session_id}")
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():  # the caller went away: the move goes on, its outcome is logged
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise


async def _move(m: SessionManager, s: Session, src: EngineHandle, target: EngineHandle, *,
                verify: bool) -> MoveReport:
    try:
        return await _move_steps(m, s, src, target, verify=verify)
    finally:
        m.moving.pop(s.id, None)


async def _move_steps(m: SessionManager, s: Session, src: EngineHandle, target: EngineHandle, *,
                      verify: bool) -> MoveReport:
    session_id = s.id
    t0 = time.perf_counter()
    try:
        blob = await src.export_session(session_id)
    except (KeyError, EngineUnavailable) as e:
        held = m.moving.pop(session_id, [])
        if s.state == SessionState.CLOSED:
            raise SessionNotFound(f"session {session_id} closed while moving") from None
        if src.holds(session_id):  # it stays where it was: what it was told meanwhile goes there after all
            for delta in held:
                src.push_input(session_id, delta)
            s.inputs.resend()
        raise MoveFailed(f"could not capture its state on engine {src.id}: {e}") from None
    t1 = time.perf_counter()
    if s.state == SessionState.CLOSED:
        m.moving.pop(session_id, None)
        raise SessionNotFound(f"session {session_id} closed while moving")
    try:
        restored = await target.import_session(session_id, s.inputs.engine_state(), seed=s.seed, blob=blob,
                                               verify=verify)
    except Exception as e:  # noqa: BLE001 - off the source and not on the target: it cannot go on
        m.moving.pop(session_id, None)
        logger.error("Session(%s): moving to engine %d failed: %r", session_id, target.id, e)
        if s.state != SessionState.CLOSED:  # (the target's own failure report may have closed it already)
            s.fail(f"moving to engine {target.id} failed: {e}")
            m.close(session_id, CloseReason.ERROR, detail=f"moving to engine {target.id} failed: {e}")
        raise MoveFailed(f"moving to engine {target.id} failed: {e}; the session is closed") from None
    t2 = time.perf_counter()
    for delta in m.moving.pop(session_id, []):
        target.push_input(session_id, delta)
    if s.state == SessionState.CLOSED:
        target.remove_session(session_id)  # closed while its add was on the way
        raise SessionNotFound(f"session {session_id} closed while moving")
    s.inputs.resend()  # epoch, wants and conditioning as they are now (a flush or prompt during the move)
    report = MoveReport(session_id, src.id, target.id, len(blob), (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                        None if restored is None else restored == blob)
    logger.info("Session(%s): moved from engine %d to %d (%d B of state, %.1f + %.1f ms)%s", session_id, src.id,
                target.id, len(blob), report.export_ms, report.import_ms,
                "" if report.identical is None else f", state identical: {report.identical}")
    return report


async def drain(m: SessionManager, engine_id: int) -> DrainReport:
    """Stop placing sessions on an engine and move every session off it, one after another.

    Sessions no other engine can take stay (`DrainReport.stayed` says why); the engine stays
    draining until `undrain`.

    Raises:
        EngineNotFound: no such engine.
    """
    e = m.engine(engine_id)
    e.draining = True
    report = DrainReport(engine_id)
    for sid in sorted(e.session_ids):
        if sid not in m.sessions:
            continue
        try:
            report.moved.append(await move_session(m, sid))
        except (MoveFailed, SessionNotFound) as err:
            report.stayed[sid] = str(err)
    logger.info("Engine(%d): drained (%d moved, %d stayed)", engine_id, len(report.moved), len(report.stayed))
    return report


def undrain(m: SessionManager, engine_id: int) -> None:
    """Place sessions on a drained engine again.

    Raises:
        EngineNotFound: no such engine.
    """
    m.engine(engine_id).draining = False
