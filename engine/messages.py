"""The engine contract: what the server tells an engine core about its sessions, and what the core answers.

Both kinds of engine take these same messages (`engine/engine_handle.py`): an
engine on a thread of the server's process applies them in place
(`engine/local_engine.py`), an engine process receives them over its pipe
(`engine/process/`); on the engine side `EngineCore.handle`
(`engine/core.py`) applies them to its device worker, and each session's
inputs are owned there (`engine/conditioner.py`). A new session carries its
whole conditioning; later messages carry changes only (vLLM v1's
`NewRequestData` / `CachedRequestData` split, `vllm/v1/core/sched/output.py`;
its `EngineCoreRequest` is the same message for every kind of engine client).

Server -> engine (commands): `AddSession`, `UpdateSession`, `PushInput`,
`RemoveSession`, `ExportSession`.
Engine -> server (events): `SessionFailed`, `SessionExported`, `SessionRestored`;
frames go by their own path (a callback in process, the shared-memory ring
from a process).
"""

from __future__ import annotations

from dataclasses import dataclass

from worldcast.engine.conditioner import ConditionerState, InputDelta

# -- server -> engine ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AddSession:
    """Start serving a session: a new one (`state` None) or one moved here (`state` its bytes).

    `conditioner` is its full conditioning (`context` given); for a moved session whose bytes
    carry their conditioner's state, None (the bytes' state is used).
    """

    session_id: str
    seed: int
    conditioner: ConditionerState | None
    state: bytes | None = None
    verify: bool = False  #: with `state`: capture it again right after the restore (in `SessionRestored`)


@dataclass(frozen=True)
class RemoveSession:
    session_id: str


@dataclass(frozen=True)
class UpdateSession:
    """The session's epoch, wants or conditioning changed (`state.context` None: unchanged)."""

    session_id: str
    state: ConditionerState


@dataclass(frozen=True)
class PushInput:
    session_id: str
    delta: InputDelta


@dataclass(frozen=True)
class ExportSession:
    """Capture a session's state at its next chunk boundary (and, with `detach`, stop serving it)."""

    request_id: int
    session_id: str
    detach: bool = True


# -- engine -> server ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionFailed:
    """A session's step failed; the engine has removed it."""

    session_id: str
    reason: str


@dataclass(frozen=True)
class SessionExported:
    request_id: int
    session_id: str
    state: bytes | None  #: None: see `error`
    error: str | None = None


@dataclass(frozen=True)
class SessionRestored:
    """A moved session's restore is done (`AddSession.state`): with `AddSession.verify`, its state captured
    again right after it; `error` where the restore failed (the session is then not on this engine)."""

    session_id: str
    state: bytes | None = None
    error: str | None = None


#: A command of the contract (server -> engine).
Command = AddSession | UpdateSession | PushInput | RemoveSession | ExportSession
#: An event of the contract (engine -> server).
Event = SessionFailed | SessionExported | SessionRestored
