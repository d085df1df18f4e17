"""EngineCore: the engine side of the engine contract, the same in the server's process and in an engine process.

It applies the contract's commands (`engine/messages.py`) to one device
worker and answers with the contract's events through `emit`; it owns each
session's inputs (`SessionConditioner`, `engine/conditioner.py`), which is
what the device thread samples at every chunk start. `LocalEngine`
(`engine/local_engine.py`) calls `handle` on the event loop of the server;
an engine process (`engine/process/main.py`) calls it on its command thread
with what came over the pipe. So the two kinds of engine differ only in how
a command reaches `handle` and how an event or a frame gets back.

Threads: `handle` on one thread (the caller's), `emit` from that thread or
the device worker's (a session's failure, an export's capture, a restore's
outcome); `emit` must be quick and must not raise.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from worldcast.engine import messages as m
from worldcast.engine import session_state
from worldcast.engine.conditioner import SessionConditioner
from worldcast.engine.device_worker import DeviceWorker
from worldcast.engine.errors import EngineError

logger = logging.getLogger(__name__)


class EngineCore:
    """Applies the contract's commands to `worker` (see the module docstring).

    Args:
        worker: the device worker (started or not); its `on_error` is taken over (a session's failure is
            emitted as `SessionFailed`).
        emit: called with each event.
    """

    def __init__(self, worker: DeviceWorker, emit: Callable[[m.Event], None]) -> None:
        self.worker = worker
        self.emit = emit
        self._lock = threading.Lock()
        self._sessions: dict[str, SessionConditioner] = {}  #: each session's inputs, by id
        worker.on_error = self._failed

    def _failed(self, session_id: str, reason: str) -> None:  # worker thread
        with self._lock:
            self._sessions.pop(session_id, None)
        self.emit(m.SessionFailed(session_id, reason))

    def conditioner(self, session_id: str) -> SessionConditioner | None:
        """The session's inputs here (None: not here)."""
        with self._lock:
            return self._sessions.get(session_id)

    def handle(self, cmd: m.Command) -> None:
        """Apply one command. Never raises for a session's fault: an `AddSession` that cannot be served here
        (no slot, a state of another model) answers `SessionFailed` (for a moved session, that is its
        restore's outcome too).

        Raises:
            TypeError: not a command of the contract.
        """
        if isinstance(cmd, m.PushInput):
            c = self.conditioner(cmd.session_id)
            if c is not None:
                c.push(cmd.delta)
                if not cmd.delta.clear:
                    self.worker.wake()  # an idle device may start the session's next chunk at once
        elif isinstance(cmd, m.UpdateSession):
            c = self.conditioner(cmd.session_id)
            if c is not None:
                c.update(cmd.state)
                self.worker.wake()
        elif isinstance(cmd, m.AddSession):
            try:
                self._add(cmd)
            except (EngineError, ValueError) as e:  # SessionStateError is both
                with self._lock:
                    self._sessions.pop(cmd.session_id, None)
                self.emit(m.SessionFailed(cmd.session_id, f"could not start here: {e}"))
        elif isinstance(cmd, m.RemoveSession):
            with self._lock:
                self._sessions.pop(cmd.session_id, None)
            self.worker.remove_session(cmd.session_id)
        elif isinstance(cmd, m.ExportSession):
            def done(state: bytes | None, error: str | None, cmd: m.ExportSession = cmd) -> None:
                if state is not None and cmd.detach:
                    with self._lock:
                        self._sessions.pop(cmd.session_id, None)
                self.emit(m.SessionExported(cmd.request_id, cmd.session_id, state, error))

            self.worker.export_session(cmd.session_id, done, detach=cmd.detach)
        else:
            raise TypeError(f"not a command of the engine contract: {type(cmd).__name__}")

    def _add(self, cmd: m.AddSession) -> None:
        state = cmd.conditioner
        captured = None
        if cmd.state is not None:  # parsed once, here, for its conditioner and for the worker's restore
            captured = session_state.parse(cmd.state, self.worker.model.spec)
            state = captured.conditioner if captured.conditioner is not None else state
        if state is None:
            raise ValueError("a session needs its conditioning")
        cond = SessionConditioner(self.worker.model, state)
        sid = cmd.session_id
        on_restored = None
        if cmd.state is not None:  # the restore's outcome goes back (the server's move waits for it)
            def on_restored(b: bytes | None, error: str | None) -> None:
                self.emit(m.SessionRestored(sid, b, error))
        with self._lock:
            self._sessions[sid] = cond
        self.worker.add_session(sid, cond, seed=cmd.seed, state=captured, on_restored=on_restored,
                                verify=cmd.verify)
