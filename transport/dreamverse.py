"""A Dreamverse-compatible WebSocket endpoint: `WS /ws`, the protocol of Dreamverse's shipped web client.

FastVideo's Dreamverse (`apps/dreamverse`: `dreamverse/session/controller.py` on the server,
`web/src/lib/ws/protocol.ts`, `web/src/lib/ws/reducer.ts`, `web/src/app/page.tsx` in the browser) streams
directed video as fMP4 over one WebSocket at `/ws`, same origin as its page. This module speaks what that
client sends and reads, with its field names; the shapes were read from that code, none of it is copied.
The project's state and rules (seeds, rollouts, the segment cap, the rule-based rewrite) are the directing
layer's (`sessions/projects.py`, over `sessions/directing.py`); prompt parsing is `dreamverse_prompts.py`,
message checks `dreamverse_messages.py`, the client's HTTP reads `dreamverse_http.py`. docs/streaming.md has the tables.
`DreamverseConnection` is a protocol translation only: it composes the connection core (`connection.py`) and the
fMP4 socket it shares with the worldcast stream (`stream_socket.py`), and overrides nothing.

Client -> server (JSON text): `session_init_v2` (first) and `project_init_v1` {curated_prompts,
initial_rollout_prompt, preset_id, preset_label, enhancement_enabled, auto_extension_enabled,
loop_generation_enabled, ...}; `append_prompt` {prompt, prompt_id}; `rewrite_seed_prompts`
{rewrite_instruction?, prompt_window_prompts?}; `set_generation_paused` {paused}; `set_loop_generation`,
`set_auto_extension`, `set_enhancement` {enabled}; `set_rewrite_model`; `reset_to_seed_prompts`;
`restart_generation`; `end_project_keep_session`; `leave`.

Server -> client: `queue_status`, `gpu_assigned`, `loop_generation_updated`, `generation_paused_updated`,
`ltx2_stream_start`, `seed_prompts_updated` {prompts, reason: init | rewrite, ...},
`rewrite_seed_prompts_started` / `_complete`, `seed_prompts_reset_pending` / `_reset_applied`,
`loop_restarted`; per segment `segment_prompt_source`, `ltx2_segment_start`, `media_init`, its own fMP4
(binary: init segment, then one media segment per frame), `media_segment_complete`, `step_complete`,
`ltx2_segment_complete`; `prompt_received`, `prompt_enhancing`, `prompt_ready`, `prompt_sources_blocked` /
`_resumed`, `generation_restarted`, `*_updated` acks, `ltx2_stream_complete`, `project_idle`,
`session_timeout`, `error` {message, error_code}.

Where worldcast does better, its events say so (a `worldcast` field, which the client ignores): a prompt or
rewrite cuts the current segment at the next denoising step instead of waiting for the segment's end; pause
acts at the next step; a full server refuses (`capacity`) instead of queueing the socket.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket

from worldcast.sessions.directing import Segment, SegmentEnd
from worldcast.sessions.errors import SessionError
from worldcast.sessions.projects import DEFAULT_SEGMENT_CAP, Project, rewrite_window
from worldcast.sessions.session import Session, SessionState
from worldcast.transport.connection import Connection
from worldcast.transport.dreamverse_messages import TOGGLES, Refused, check_message
from worldcast.transport.dreamverse_prompts import REWRITE_MODEL, ProjectInit
from worldcast.transport.fmp4 import Fmp4Fragmenter
from worldcast.transport.limits import InputGuard
from worldcast.transport.schemas import MAX_PROMPT_CHARS
from worldcast.transport.stream_socket import CLOSE_NORMAL, CLOSE_POLICY, REFUSED, StreamSocket, dumps
from worldcast.transport.ws_queue import MediaItem, QueueOverflow, Render

logger = logging.getLogger(__name__)

#: Largest text message, bytes: session_init_v2 carries the whole list of curated prompts.
MAX_DREAMVERSE_BYTES = 64 * 1024

__all__ = ["MAX_DREAMVERSE_BYTES", "DreamverseConnection"]


@dataclass
class DvSegment:
    """Dreamverse's view of one directing segment."""

    segment_idx: int  #: from 1 in each rollout
    source: str  #: "curated", "user_raw" or "auto_extension"
    prompt_id: str | None
    seed_prompt_index: int | None
    stream_id: str = ""
    chunks: int = 0  #: binary messages sent for it (its init segment included)
    media_started: bool = False


class DreamverseConnection:
    """One Dreamverse client on a directing session of its own: Dreamverse's protocol on a `StreamSocket`.

    A protocol translation (its messages to the directing layer's calls, the layer's segment events and the
    stream's media to Dreamverse's messages) over the connection core and the stream socket, by composition.

    Args:
        ws, session, video_scale, guard: as `ws_stream.StreamConnection`.
        init: the `session_init_v2` request (the first project).
        segment_s: segment length, s.
        segment_cap: segments per rollout before `ltx2_stream_complete` (0: no cap).
        session_timeout_s: the session ends after this long (sent in `gpu_assigned`).
        on_frames: as `ws_stream.StreamConnection`.
    """

    def __init__(self, ws: WebSocket, session: Session, *, video_scale: int, init: ProjectInit,
                 segment_s: float, session_timeout_s: float, segment_cap: int = DEFAULT_SEGMENT_CAP,
                 guard: InputGuard | None = None, on_frames: Callable[[str, int], None] | None = None) -> None:
        self.session = session
        self.conn = Connection(session, send=self.send_feedback, on_flood=lambda v: self.out.close(CLOSE_POLICY),
                               guard=guard, name="dv")
        self.out = StreamSocket(ws, session, self, self.conn, video_scale=video_scale,
                                max_text_bytes=MAX_DREAMVERSE_BYTES, on_frames=on_frames)
        self.director = self.out.director
        assert self.director is not None, "Dreamverse clients drive a directing session"
        self.guard, self.sink, self.queue, self.frames = self.conn.guard, self.out.sink, self.out.queue, self.out.frames
        self.send_json, self.close = self.out.send_json, self.out.close
        self._queue_control = self.out.queue_control
        self.errors_sent = 0
        self._init_sent_for: object | None = None
        self.init, self.segment_s, self.session_timeout_s = init, segment_s, session_timeout_s
        self.project = Project(cap=segment_cap)
        self.user_paused = False
        self._pending: DvSegment | None = None  #: meta of the segment `direct` is about to open
        self._segments: dict[int, DvSegment] = {}  #: director segment index -> Dreamverse meta
        self._media_segment: int | None = None  #: director segment whose media is being sent
        self._seg_fragmenter: Fmp4Fragmenter | None = None
        self._blocked_at: int | None = None
        self._announce_pending: list[dict[str, Any]] | None = None  #: a rollout's start, sent before its segment
        self._stream_open = False  #: ltx2_stream_start sent, ltx2_stream_complete not since

    def __repr__(self) -> str:
        return f"DreamverseConnection({self.session.id})"

    async def run(self) -> None:
        """Serve the client until it leaves, the session closes or the reader stalls for good."""
        await self.out.run()

    async def aclose(self) -> None:
        """Detach from the session and stop every task (idempotent)."""
        await self.out.aclose()

    # -- outgoing ------------------------------------------------------------------------------------

    def send(self, kind: str, **fields: Any) -> None:
        """Queue a Dreamverse message `{"type": kind, **fields}` (a field cannot override the type)."""
        self.send_json({**fields, "type": kind})

    def error(self, code: str, message: str, **fields: Any) -> None:
        """Dreamverse's error shape: {type: "error", message}, plus our `error_code`."""
        self.errors_sent += 1
        self.send("error", message=message, error_code=code, **fields)

    def render(self, item: MediaItem) -> list[str | bytes]:
        """Binary only; each segment is its own fMP4 (media_init + init segment, timeline from 0)."""
        seg_index = item.meta["event"]["segment"]
        dv = self._segments.get(seg_index)
        if dv is None:
            return []
        out: list[str | bytes] = []
        enc = item.meta["encoder"]
        if seg_index != self._media_segment or enc is not self._init_sent_for:
            self._media_segment, self._init_sent_for = seg_index, enc
            self._seg_fragmenter = Fmp4Fragmenter.from_encoder(enc)
            dv.media_started = True
            out += [dumps({"type": "media_init", "segment_idx": dv.segment_idx, "mime": enc.mime,
                           "stream_id": dv.stream_id, "mode": "av_fmp4"}), enc.init_segment]
            dv.chunks += 1
        assert self._seg_fragmenter is not None
        out.append(self._seg_fragmenter.fragment(item.sample))
        dv.chunks += 1
        return out

    # -- project ------------------------------------------------------------------------------------------

    def opening(self) -> None:
        self._begin(self.init, first=True)
        self.conn.spawn(self._timeout(), name=f"dv-timeout-{self.session.id}")

    def _begin(self, init: ProjectInit, *, first: bool) -> None:
        """Start a project: Dreamverse's start-up events, then its first segment (through the control loop).
        A custom start (a prompt, no curated ones) is rewritten into seeds first, as Dreamverse's LLM would."""
        p = self.project
        p.begin(init)
        self.user_paused, self._blocked_at = False, None
        for msg in init.errors:
            self.error("bad_prompt", msg)
        self.send("loop_generation_updated", enabled=p.loop)
        if init.initial_prompt is not None:
            self.send("generation_paused_updated", paused=True)  # waiting for the rollout's rewrite
            self._rewrite_events(init.initial_prompt)
            self.send("generation_paused_updated", paused=False)
            self._announce("initial_rewrite")
        else:
            self.send("generation_paused_updated", paused=False)
            self._announce(None if first else "project_init")
            self.send("seed_prompts_updated", prompts=p.seeds, preset_id=p.preset_id, preset_label=p.preset_label,
                      reason="init", seed_prompt_count=len(p.seeds))
        self._queue_control({"type": "_next"}, limited=False)

    def _rewrite_events(self, instruction: str | None) -> None:
        p = self.project
        self.send("rewrite_seed_prompts_started", model=REWRITE_MODEL)
        common = {"preset_id": p.preset_id, "preset_label": p.preset_label, "fallback_used": False, "error": None,
                  "model": REWRITE_MODEL, "latency_ms": 0.0}
        self.send("seed_prompts_updated", prompts=p.seeds, reason="rewrite", raw_llm_output=None,
                  rewrite_instruction=instruction or "", seed_prompt_count=len(p.seeds), **common,
                  worldcast={"rule": "the instruction is the next direction; the window's unplayed prompts follow"})
        self.send("rewrite_seed_prompts_complete", **common)

    def _stream_start_fields(self) -> dict[str, Any]:
        p = self.project
        return {"total_segments": len(p.seeds), "preset_id": p.preset_id, "stream_mode": "av_fmp4",
                "live_mode": True, "loop_generation_enabled": p.loop, "loop_iteration": p.rollout,
                "generation_segment_cap": p.cap,
                "worldcast": {"new_prompt": "cuts the current segment at the next denoising step",
                              "pause": "takes effect at the next denoising step",
                              "segment_s": self.segment_s, "fps": self.session.model.spec.fps}}

    def _announce(self, reason: str | None) -> None:
        """A rollout starts: `ltx2_stream_start` and why (`seed_prompts_reset_applied` / `loop_restarted`),
        sent now if no segment is open, else just before the next segment (after the open one's end)."""
        p = self.project
        msgs = [{"type": "ltx2_stream_start", **self._stream_start_fields()}]
        counts = {"loop_iteration": p.rollout, "seed_prompt_count": len(p.seeds), "dropped_user_raw_queue": 0,
                  "dropped_user_ready_queue": 0}
        if reason == "loop_restart":
            msgs.append({"type": "loop_restarted", **counts})
        elif reason is not None:
            msgs.append({"type": "seed_prompts_reset_applied", "reason": reason, **counts})
        assert self.director is not None
        if self.director.current is None:
            self._announce_pending = None
            self._send_announcement(msgs)
        else:
            self._announce_pending = msgs

    def _send_announcement(self, msgs: list[dict[str, Any]]) -> None:
        self._stream_open = True
        for m in msgs:
            self.send_json(m)

    def _stream_complete(self) -> None:
        if self._stream_open:
            self._stream_open = False
            self.send("ltx2_stream_complete")

    def _unpause(self) -> None:
        if self.user_paused:
            self.user_paused = False
            self.send("generation_paused_updated", paused=False)

    async def _timeout(self) -> None:
        await asyncio.sleep(self.session_timeout_s)
        self.send("session_timeout", message=f"Session expired after {self.session_timeout_s:g} seconds")
        self.close(CLOSE_NORMAL)

    # -- incoming --------------------------------------------------------------------------------------

    def send_feedback(self, event: dict[str, Any]) -> None:
        """The guard's events in Dreamverse's shape: `error` {message, error_code, ...}; the flood verdict
        is an `error` with error_code "flood" (the socket then closes 1008)."""
        ev = dict(event)
        kind = ev.pop("event", None)
        if kind == "disconnect":
            self.send("error", message=ev.get("message", "flood"), error_code="flood")
            return
        code = ev.pop("code", "error") if kind == "error" else str(kind)
        self.send("error", message=ev.pop("message", ""), error_code=code, **ev)

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
            self._stream_complete()
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
            self.user_paused, self._announce_pending, self._blocked_at = False, None, None
            self._stream_complete()
            self.send("project_idle", dropped_user_raw_queue=0, dropped_user_ready_queue=0)
        elif not p.active:
            self.error("no_project", f"{kind}: no project is active; send project_init_v1 first")
        elif kind == "append_prompt":
            await self._start(obj["prompt"], source="user_raw", prompt_id=obj["prompt_id"], seed_index=None)
        elif kind == "rewrite_seed_prompts":
            base = obj["window"] or p.seeds
            instruction = obj["instruction"]
            open_ = self.director.current is not None
            p.new_rollout(rewrite_window(instruction, base, p.window_played(base) if instruction else 0))
            self._rewrite_events(instruction)
            self._unpause()
            self._announce("rewrite_during_generation" if open_ else "rewrite_rollout")
            await self._next(force=True)
        elif kind in ("restart_generation", "reset_to_seed_prompts"):
            if kind == "restart_generation":
                self.send("generation_restarted", reason="cap_restart", segment_cap=p.cap)
            self._unpause()
            p.new_rollout()
            self._announce("cap_restart" if kind == "restart_generation" else "manual_reset")
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
            self._announce("loop_restart")
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
        if self._announce_pending is not None:
            self._send_announcement(self._announce_pending)
            self._announce_pending = None
        if kind == "capped" and not p.capped:
            p.capped = True
            self._stream_complete()
        elif kind == "blocked" and self._blocked_at != p.started + 1:
            self._blocked_at = p.started + 1
            self.send("prompt_sources_blocked", segment_idx=p.started + 1)

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
        self._pending = DvSegment(p.started, source, prompt_id, seed_index,
                                  stream_id=f"{self.session.id}-{p.rollout}-{p.started}")
        try:
            self.director.direct(str(p.started), prompt, context, duration_s=self.segment_s)
            if self.user_paused:
                self.director.pause()
        except SessionError as e:
            self.error("session_closed", str(e))
        finally:
            self._pending = None

    # -- segment events ----------------------------------------------------------------------------------

    def segment_start(self, seg: Segment) -> None:
        p = self.project
        dv = self._pending or DvSegment(p.started, "user_raw", None, None)
        self._segments[seg.index] = dv
        if self._announce_pending is not None:
            self._send_announcement(self._announce_pending)
            self._announce_pending = None
        if self._blocked_at is not None:
            self._blocked_at = None
            self.send("prompt_sources_resumed", segment_idx=dv.segment_idx, source=dv.source,
                      prompt_id=dv.prompt_id)
        self.send("segment_prompt_source", segment_idx=dv.segment_idx, source=dv.source, prompt_id=dv.prompt_id,
                  fallback_used=False, seed_prompt_index=dv.seed_prompt_index, loop_iteration=p.rollout)
        self.send("ltx2_segment_start", segment_idx=dv.segment_idx, total_segments=self._total(dv),
                  prompt=seg.prompt, source=dv.source, seed_prompt_index=dv.seed_prompt_index,
                  loop_iteration=p.rollout, worldcast={"target_frames": seg.target_frames})

    def _total(self, dv: DvSegment) -> int:
        return max(dv.segment_idx, len(self.project.seeds))

    def segment_complete(self, seg: Segment) -> None:
        dv = self._segments.get(seg.index)
        if dv is None:
            return
        summary = seg.summary(self.director.fps if self.director else 1.0)
        cut = seg.end == SegmentEnd.CUT
        total = self._total(dv)

        def render() -> list[str | bytes]:  # at send time: after every media segment of it went out
            self._segments.pop(seg.index, None)
            t = summary["timings_ms"]
            assert isinstance(t, dict)
            wall = float(t.get("wall") or 0.0)
            worker = float(sum(t.get(k) or 0.0 for k in ("queue", "denoise", "decode")) * seg.frames)
            out: list[str | bytes] = []
            if dv.media_started:
                out.append(dumps({"type": "media_segment_complete", "segment_idx": dv.segment_idx,
                                  "stream_id": dv.stream_id, "chunks": dv.chunks}))
            out.append(dumps({"type": "step_complete", "latency_ms": {
                "total": round(wall, 2), "worker_e2e": round(worker, 2), "main_user_step": round(wall, 2),
                "overhead": round(wall - worker, 2)}}))
            sent, dropped = self.frames.segment(seg.index)  # final: its media were sent or dropped
            out.append(dumps({"type": "ltx2_segment_complete", "segment_idx": dv.segment_idx,
                              "total_segments": total, "cut": cut, "frames": sent, "dropped": dropped,
                              "worldcast": {"end": summary["end"], "ttff_ms": t.get("ttff")}}))
            if seg.end == SegmentEnd.FINISHED:  # every frame of it has been sent: the next prompt's flush drops none
                self._queue_control({"type": "_next"}, limited=False)
            return out

        def enqueue() -> None:
            try:
                self.queue.put_control(Render(render))
            except QueueOverflow:
                self.close()

        if seg.end == SegmentEnd.FINISHED:  # after its last frames have left the encoder
            self.sink.when_done(enqueue)
        else:
            enqueue()

    def on_state(self, session: Session, state: object) -> None:
        if state == SessionState.CLOSED:
            self.close(CLOSE_NORMAL)

    def on_error(self, session: Session, reason: object) -> None:
        self.error(getattr(reason, "code", "session_failed"), f"AV streaming failed: {reason}")
