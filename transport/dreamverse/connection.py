"""A Dreamverse-compatible WebSocket endpoint, `WS /ws`: the adapter that reads the client and drives directing.

FastVideo's Dreamverse (`apps/dreamverse`: `dreamverse/session/controller.py` on the server,
`web/src/lib/ws/protocol.ts`, `web/src/lib/ws/reducer.ts`, `web/src/app/page.tsx` in the browser) streams
directed video as fMP4 over one WebSocket at `/ws`, same origin as its page. This module speaks what that
client sends and reads, with its field names; the shapes were read from that code, none of it is copied.
The project's state and rules (seeds, rollouts, the segment cap, the rule-based rewrite) are the directing
layer's (`sessions/projects.py`, over `sessions/directing.py`); prompt parsing is `prompts.py`,
message checks `messages.py`, the client's HTTP reads `http.py`, and every message the
client reads (rollout starts, segment events, per-segment media) `events.py`. docs/streaming.md has
the tables. `DreamverseConnection` owns the incoming half: it checks each client message, answers the
acknowledgements, and turns requests into the project's and the directing layer's calls, in arrival order.
It is a protocol translation only: it composes the connection core (`transport/connection.py`), the fMP4
socket it shares with the worldcast stream (`transport/stream/socket.py`) and its `DreamverseEvents`, and
overrides nothing.

Client -> server (JSON text): `session_init_v2` (first) and `project_init_v1` {curated_prompts,
initial_rollout_prompt, preset_id, preset_label, enhancement_enabled, auto_extension_enabled,
loop_generation_enabled, ...}; `append_prompt` {prompt, prompt_id}; `rewrite_seed_prompts`
{rewrite_instruction?, prompt_window_prompts?}; `set_generation_paused` {paused}; `set_loop_generation`,
`set_auto_extension`, `set_enhancement` {enabled}; `set_rewrite_model`; `reset_to_seed_prompts`;
`restart_generation`; `end_project_keep_session`; `leave`.

Server -> client (the acknowledgements here; the rest in `events.py`): `loop_generation_updated`,
`generation_paused_updated`, `prompt_received`, `prompt_enhancing`, `prompt_ready`, `generation_restarted`,
`seed_prompts_reset_pending`, `*_updated` acks, `project_idle`, `session_timeout`, `error` {message,
error_code}; `queue_status` and `gpu_assigned` come from admission (`serve.py`).

Where worldcast does better, its events say so (a `worldcast` field, which the client ignores): a prompt or
rewrite cuts the current segment at the next denoising step instead of waiting for the segment's end; pause
acts at the next step; a full server refuses (`capacity`) instead of queueing the socket.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket

from worldcast.sessions.errors import SessionError
from worldcast.sessions.projects import DEFAULT_SEGMENT_CAP, Project, rewrite_window
from worldcast.sessions.session import Session, SessionState
from worldcast.transport.connection import Connection
from worldcast.transport.dreamverse.events import DreamverseEvents, DvSegment
from worldcast.transport.dreamverse.messages import TOGGLES, check_message
from worldcast.transport.dreamverse.prompts import REWRITE_MODEL, ProjectInit
from worldcast.transport.errors import Refused
from worldcast.transport.limits import InputGuard
from worldcast.transport.schemas import MAX_PROMPT_CHARS
from worldcast.transport.stream.socket import CLOSE_NORMAL, CLOSE_POLICY, REFUSED, StreamSocket

logger = logging.getLogger(__name__)

#: Largest text message, bytes: session_init_v2 carries the whole list of curated prompts.
MAX_DREAMVERSE_BYTES = 64 * 1024

__all__ = ["MAX_DREAMVERSE_BYTES", "DreamverseConnection"]


class DreamverseConnection:
    """One Dreamverse client on a directing session of its own: Dreamverse's protocol on a `StreamSocket`.

    A protocol translation (its messages to the project's and the directing layer's calls) over the connection
    core and the stream socket, by composition; what the client reads back is its `events`.

    Args:
        ws, session, video_scale, guard: as `stream.connection.StreamConnection`.
        init: the `session_init_v2` request (the first project).
        segment_s: segment length, s.
        segment_cap: segments per rollout before `ltx2_stream_complete` (0: no cap).
        session_timeout_s: the session ends after this long (sent in `gpu_assigned`).
        on_frames: as `stream.connection.StreamConnection`.
    """

    def __init__(self, ws: WebSocket, session: Session, *, video_scale: int, init: ProjectInit,
                 segment_s: float, session_timeout_s: float, segment_cap: int = DEFAULT_SEGMENT_CAP,
                 guard: InputGuard | None = None, on_frames: Callable[[str, int], None] | None = None) -> None:
        self.session = session
        self.conn = Connection(session, send=lambda event: self.events.feedback(event),
                               on_flood=lambda v: self.out.close(CLOSE_POLICY), guard=guard, name="dv")
        self.out = StreamSocket(ws, session, self, self.conn, video_scale=video_scale,
                                max_text_bytes=MAX_DREAMVERSE_BYTES, on_frames=on_frames)
        self.director = self.out.director
        assert self.director is not None, "Dreamverse clients drive a directing session"
        self.guard, self.close = self.conn.guard, self.out.close
        self._queue_control = self.out.queue_control
        self.init, self.segment_s, self.session_timeout_s = init, segment_s, session_timeout_s
        self.project = Project(cap=segment_cap)
        self.user_paused = False
        self.events = ev = DreamverseEvents(self.out, self.director, self.project, segment_s=segment_s,
                                            queue_control=self._queue_control)
        # the socket's `StreamProtocol` calls for what the client reads go straight to the events
        self.send, self.error, self.render = ev.send, ev.error, ev.render
        self.segment_start, self.segment_complete = ev.segment_start, ev.segment_complete

    def __repr__(self) -> str:
        return f"DreamverseConnection({self.session.id})"

    async def run(self) -> None:
        """Serve the client until it leaves, the session closes or the reader stalls for good."""
        await self.out.run()

    async def aclose(self) -> None:
        """Detach from the session and stop every task (idempotent)."""
        await self.out.aclose()

    # -- project ------------------------------------------------------------------------------------------

    def opening(self) -> None:
        self._begin(self.init, first=True)
        self.conn.spawn(self._timeout(), name=f"dv-timeout-{self.session.id}")

    def _begin(self, init: ProjectInit, *, first: bool) -> None:
        """Start a project: Dreamverse's start-up events, then its first segment (through the control loop).
        A custom start (a prompt, no curated ones) is rewritten into seeds first, as Dreamverse's LLM would."""
        self.project.begin(init)
        self.user_paused, self.events.blocked_at = False, None
        self.events.project_started(init, first=first)
        self._queue_control({"type": "_next"}, limited=False)

    def _unpause(self) -> None:
        if self.user_paused:
            self.user_paused = False
            self.send("generation_paused_updated", paused=False)

    async def _timeout(self) -> None:
        await asyncio.sleep(self.session_timeout_s)
        self.send("session_timeout", message=f"Session expired after {self.session_timeout_s:g} seconds")
        self.close(CLOSE_NORMAL)

    # -- incoming --------------------------------------------------------------------------------------

    def on_text(self, text: str) -> None:
        """Check and dispatch one client message; a bad one gets a precise `error` and changes nothing."""
        now, refuse = time.monotonic(), self.out.refuse
        data = self.out.read(text, now, what="Dreamverse")
        if data is REFUSED:
            return
        kind = data.get("type") if isinstance(data, dict) else None
        if not isinstance(kind, str):
            refuse("bad_message", "expected a JSON object with a string 'type'", "invalid", now)
            return
        try:
            obj = check_message(kind, data, self.project)
        except Refused as e:
            refuse(e.code, e.message, "invalid", now, request=kind[:64])
            return
        if kind == "set_rewrite_model":
            self.send("rewrite_model_updated", rewrite_model=REWRITE_MODEL,
                      worldcast={"note": "worldcast rewrites by rule; there is no model to choose"})
            return
        if kind == "leave":
            self.events.stream_complete()
            self.close(CLOSE_NORMAL)
            return
        if kind in TOGGLES or kind == "set_generation_paused":
            if not self.guard.take("control", now):
                refuse("rate_limited", f"too many {kind} messages", "rate_limited", now, request=kind)
                return
            self.guard.accepted("control", now)
            self._toggle(kind, obj["enabled"])
            return
        if not self._queue_control(obj):
            return  # refused (rate limit), and told so (with its prompt_id): never acknowledged
        self.guard.accepted("control", now)
        if kind == "append_prompt":
            self.send("prompt_received", prompt_id=obj["prompt_id"], queue_depth=0,
                      worldcast={"applies": "now", "cuts_segment": self.director.current is not None,  # type: ignore[union-attr]
                                 "truncated_to_chars": MAX_PROMPT_CHARS if obj["truncated"] else None})
        elif kind == "reset_to_seed_prompts":
            self.send("seed_prompts_reset_pending", seed_prompt_count=len(self.project.seeds),
                      worldcast={"applies": "now"})

    def _toggle(self, kind: str, enabled: bool) -> None:
        if kind == "set_generation_paused":
            self._set_paused(enabled)
            return
        attr, ack = TOGGLES[kind]
        setattr(self.project, attr, enabled)
        self.send(ack, enabled=enabled)
        if enabled:  # loop or auto-extension may unblock a rollout that ran out of seeds
            self._queue_control({"type": "_next"}, limited=False)

    def _set_paused(self, paused: bool) -> None:
        assert self.director is not None
        self.user_paused = paused
        try:
            if paused:
                self.director.pause()
            elif self.director.current is not None:
                self.director.resume()  # only an open segment resumes; a finished one stays finished
            else:
                self._queue_control({"type": "_next"}, limited=False)
        except SessionError as e:
            self.error("session_closed", str(e))
            return
        self.send("generation_paused_updated", paused=paused, worldcast={"applies": "next_step"})

    async def handle_control(self, obj: dict[str, Any]) -> None:
        """Run one queued request, in arrival order (state checks again: an earlier request may have ended
        the project)."""
        kind, p = obj["type"], self.project
        assert self.director is not None
        if kind == "_next":
            await self._next()
        elif kind == "project_init_v1":
            if p.active:
                self.error("project_active", "a project is active; send end_project_keep_session and wait for "
                           "project_idle before project_init_v1")
            else:
                self._begin(obj["init"], first=False)
        elif kind == "end_project_keep_session":  # at once (a cut at the next step); idle again if idle
            if self.director.current is not None:
                self.director.halt()  # its end goes out first; no frame of it after
            p.end()
            self.user_paused, self.events.announce_pending, self.events.blocked_at = False, None, None
            self.events.stream_complete()
            self.send("project_idle", dropped_user_raw_queue=0, dropped_user_ready_queue=0)
        elif not p.active:
            self.error("no_project", f"{kind}: no project is active; send project_init_v1 first")
        elif kind == "append_prompt":
            await self._start(obj["prompt"], source="user_raw", prompt_id=obj["prompt_id"], seed_index=None)
        elif kind == "rewrite_seed_prompts":
            base = obj["window"] or p.seeds
            instruction = obj["instruction"]
            open_ = self.director.current is not None
            p.new_rollout(rewrite_window(instruction, base))
            self.events.rewrite(instruction)
            self._unpause()
            self.events.announce("rewrite_during_generation" if open_ else "rewrite_rollout")
            await self._next(force=True)
        elif kind in ("restart_generation", "reset_to_seed_prompts"):
            if kind == "restart_generation":
                self.send("generation_restarted", reason="cap_restart", segment_cap=p.cap)
            self._unpause()
            p.new_rollout()
            self.events.announce("cap_restart" if kind == "restart_generation" else "manual_reset")
            await self._next(force=True)

    async def _next(self, *, force: bool = False) -> None:
        """Start the project's next segment unless one is open (`force`: cut it) or the user paused; else say
        why nothing plays (the rollout's cap reached: `ltx2_stream_complete`; no prompt left: blocked)."""
        assert self.director is not None
        p = self.project
        if self.user_paused or (self.director.current is not None and not force):
            return
        kind = p.next_kind()
        if kind == "loop":
            p.new_rollout()
            self.events.announce("loop_restart")
            kind = "seed"
        if kind == "seed":
            prompt, i = p.take_seed()
            await self._start(prompt, source="curated", prompt_id=None, seed_index=i)
            return
        if kind == "auto" and p.last_prompt is not None:
            await self._start(p.last_prompt, source="auto_extension", prompt_id=None, seed_index=None)
            return
        if force and self.director.current is not None:
            self.director.halt()
        self.events.send_pending_announcement()
        if kind == "capped" and not p.capped:
            p.capped = True
            self.events.stream_complete()
        elif kind == "blocked":
            self.events.blocked(p.started + 1)

    async def _start(self, prompt: str, *, source: str, prompt_id: str | None, seed_index: int | None) -> None:
        assert self.director is not None
        try:
            context = await asyncio.get_running_loop().run_in_executor(None, self.session.encode_prompt, prompt)
        except SessionError as e:
            self.error("bad_prompt", str(e))
            return
        p = self.project
        if prompt_id is not None:  # Dreamverse's order: received, enhancing, ready, then the segment
            if p.enhancement:
                self.send("prompt_enhancing", prompt_id=prompt_id, worldcast={"enhancer": None,
                                                                             "note": "used as written"})
            self.send("prompt_ready", prompt_id=prompt_id, prompt=prompt, source=source, latency_ms=0.0)
        p.started += 1
        p.last_prompt = prompt
        self.events.pending = DvSegment(p.started, source, prompt_id, seed_index,
                                  stream_id=f"{self.session.id}-{p.rollout}-{p.started}")
        try:
            self.director.direct(str(p.started), prompt, context, duration_s=self.segment_s)
            if self.user_paused:
                self.director.pause()
        except SessionError as e:
            self.error("session_closed", str(e))
        finally:
            self.events.pending = None

    def on_state(self, session: Session, state: object) -> None:
        if state == SessionState.CLOSED:
            self.close(CLOSE_NORMAL)

    def on_error(self, session: Session, reason: object) -> None:
        self.error(getattr(reason, "code", "session_failed"), f"AV streaming failed: {reason}")

    def on_control(self, session: Session, to: object) -> None:
        """Control of the session was handed over (`Session.hand_over`): this client was its controller, so it is
        told and closed, as the worldcast stream's controller is."""
        self.error("control_handed_over", "control of this session was handed over: this connection closes")
        self.close(CLOSE_NORMAL)
