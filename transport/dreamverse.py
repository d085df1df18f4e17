"""A Dreamverse-compatible WebSocket endpoint: `WS /ws`, the subset of its protocol a Dreamverse client needs.

FastVideo's Dreamverse (`apps/dreamverse`: `dreamverse/session/controller.py`
on the server, `web/src/lib/ws/protocol.ts`, `web/src/lib/ws/reducer.ts`,
`web/src/app/page.tsx` in the browser) streams directed video as fMP4 over
one WebSocket at `/ws`, same origin as its page. This module speaks the part
of that protocol its browser client uses to start a session, stream segments
and steer them, with the field names that client reads; the message shapes
were read from that code, none of it is copied.

Client -> server (JSON text):
    session_init_v2       {curated_prompts: [str], initial_rollout_prompt?: str, preset_id?, ...}  first message
    append_prompt         {prompt: str, prompt_id?: str}
    set_generation_paused {paused: bool}
    restart_generation    {}
    leave                 {}

Server -> client: `queue_status` {position, total_gpus, available_gpus};
`gpu_assigned` {gpu_id, session_timeout}; `ltx2_stream_start` {total_segments,
preset_id, stream_mode: "av_fmp4", live_mode, loop_generation_enabled,
loop_iteration, generation_segment_cap}; per segment `segment_prompt_source`,
`ltx2_segment_start` {segment_idx (from 1), total_segments, prompt, source,
seed_prompt_index, loop_iteration}, `media_init` {segment_idx, mime,
stream_id, mode: "av_fmp4"}, the segment's fMP4 (its own init segment, then
one media segment per frame; binary), `media_segment_complete` {segment_idx,
stream_id, chunks}, `step_complete` {latency_ms: {total, worker_e2e,
main_user_step, overhead}}, `ltx2_segment_complete` {segment_idx,
total_segments}; `prompt_received` {prompt_id, queue_depth}, `prompt_ready`,
`generation_paused_updated` {paused}, `generation_restarted`,
`prompt_sources_blocked` {segment_idx}, `session_timeout`,
`ltx2_stream_complete`, `error` {message, error_code}.

Where worldcast does better, its events say so (a `worldcast` field, which
Dreamverse's client ignores): a new prompt does not wait for the segment to
finish: it cuts the current segment at the next denoising step
(`prompt_received.queue_depth` is 0, `applies: "now"`; the cut segment's
`ltx2_segment_complete` has `cut: true`); pausing takes effect at the next
denoising step, not at the segment boundary. There is no queue: a server
without room refuses with an `error` (`error_code: "capacity"`,
`retry_after_s`) instead of holding the socket. Unknown message types get an
`error` (`unknown_type`), Dreamverse types outside this subset an `error`
(`unsupported`); the socket stays open.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from worldcast.sessions.directing import Segment, SegmentEnd
from worldcast.sessions.errors import CapacityExhausted, InvalidConditioning, SessionError
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import CloseReason, Session, SessionState
from worldcast.transport.fmp4 import Fmp4Fragmenter
from worldcast.transport.limits import InputGuard
from worldcast.transport.rpc import RpcError, parse_json
from worldcast.transport.schemas import MAX_PROMPT_CHARS, check_prompt
from worldcast.transport.ws_queue import MediaItem, QueueOverflow, Render
from worldcast.transport.ws_stream import CLOSE_NORMAL, CLOSE_POLICY, StreamConnection, dumps

logger = logging.getLogger(__name__)

#: Largest text message, bytes: session_init_v2 carries the whole list of curated prompts.
MAX_DREAMVERSE_BYTES = 64 * 1024
#: Curated prompts taken from session_init_v2, at most.
MAX_CURATED_PROMPTS = 64
#: How long the server waits for session_init_v2, s. Dreamverse then starts without prompts; worldcast closes
#: the socket (4408, `init_timeout`): no session is made for a socket that never starts one.
INIT_TIMEOUT_S = 10.0
CLOSE_INIT_TIMEOUT = 4408
#: Messages other than session_init_v2 a socket may send before it, at most (then it is closed 1008).
MAX_PRE_INIT_MESSAGES = 16
#: Close code when the server has no room (RFC 6455 7.4.1: "try again later").
CLOSE_TRY_AGAIN_LATER = 1013
#: Dreamverse message types outside the subset served here.
UNSUPPORTED = frozenset({
    "project_init_v1", "end_project_keep_session", "simple_generate", "set_enhancement", "set_auto_extension",
    "set_loop_generation", "reset_to_seed_prompts", "rewrite_seed_prompts", "set_rewrite_model",
    "set_rewrite_temperature", "select_model",
})
SUPPORTED = ("append_prompt", "set_generation_paused", "restart_generation", "leave")


class PromptError(ValueError):
    """A prompt Dreamverse would send that worldcast cannot use (blank, control characters)."""


def clean_prompt(text: object) -> tuple[str, bool]:
    """A Dreamverse prompt as worldcast takes it: `check_prompt`'s rule, then at most MAX_PROMPT_CHARS
    (cut at a word).

    Returns:
        (prompt, whether it was shortened).

    Raises:
        PromptError: not a string, or refused by `check_prompt` (no visible text, control or bidi characters).
    """
    if not isinstance(text, str):
        raise PromptError(f"prompt must be a string, got {type(text).__name__}")
    try:
        p = check_prompt(text)
    except ValueError as e:
        raise PromptError(str(e)) from None
    assert p is not None
    if len(p) <= MAX_PROMPT_CHARS:
        return p, False
    cut = p[:MAX_PROMPT_CHARS]
    return (cut.rsplit(" ", 1)[0] if " " in cut[MAX_PROMPT_CHARS // 2:] else cut), True


@dataclass
class DvSegment:
    """Dreamverse's view of one directing segment."""

    segment_idx: int  #: from 1, reset by restart_generation
    source: str  #: "curated" or "user_raw"
    prompt_id: str | None
    seed_prompt_index: int | None
    stream_id: str = ""
    chunks: int = 0  #: binary messages sent for it (its init segment included)
    media_started: bool = False


class DreamverseConnection(StreamConnection):
    """One Dreamverse client on a directing session of its own.

    Args:
        ws, session, video_scale, guard: as `StreamConnection`.
        prompts: the curated prompts, played in order, one segment each.
        preset_id: echoed in `ltx2_stream_start`.
        segment_s: segment length, s.
        session_timeout_s: the session ends after this long (sent in `gpu_assigned`).
    """

    def __init__(self, ws: WebSocket, session: Session, *, video_scale: int,
                 prompts: list[str], preset_id: Any, segment_s: float, session_timeout_s: float,
                 guard: InputGuard | None = None) -> None:
        super().__init__(ws, session, video_scale=video_scale, guard=guard)
        assert self.director is not None, "Dreamverse clients drive a directing session"
        self.prompts, self.preset_id, self.segment_s = prompts, preset_id, segment_s
        self.session_timeout_s = session_timeout_s
        self.next_prompt = 0
        self.segment_idx = 0
        self.loop_iteration = 1
        self.user_paused = False
        self._pending: DvSegment | None = None  #: meta of the segment `direct` is about to open
        self._segments: dict[int, DvSegment] = {}  #: director segment index -> Dreamverse meta
        self._media_segment: int | None = None  #: director segment whose media is being sent
        self._seg_fragmenter: Fmp4Fragmenter | None = None
        self._blocked_at: int | None = None
        self._restart_pending = False

    def __repr__(self) -> str:
        return f"DreamverseConnection({self.session.id})"

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
            dv.stream_id, dv.media_started = f"{self.session.id}-{self.loop_iteration}-{dv.segment_idx}", True
            out += [dumps({"type": "media_init", "segment_idx": dv.segment_idx, "mime": enc.mime,
                           "stream_id": dv.stream_id, "mode": "av_fmp4"}), enc.init_segment]
            dv.chunks += 1
        assert self._seg_fragmenter is not None
        out.append(self._seg_fragmenter.fragment(item.sample))
        dv.chunks += 1
        return out

    # -- stream ------------------------------------------------------------------------------------------

    def opening(self) -> None:
        self.send("ltx2_stream_start", **self._stream_start_fields())
        self.send("generation_paused_updated", paused=False)
        self._queue_control({"type": "_next"}, limited=False)
        timer = asyncio.get_running_loop().create_task(self._timeout(), name=f"dv-timeout-{self.session.id}")
        self._tasks.append(timer)

    def _stream_start_fields(self) -> dict[str, Any]:
        return {"total_segments": len(self.prompts), "preset_id": self.preset_id, "stream_mode": "av_fmp4",
                "live_mode": True, "loop_generation_enabled": False, "loop_iteration": self.loop_iteration,
                "generation_segment_cap": 0,
                "worldcast": {"new_prompt": "cuts the current segment at the next denoising step",
                              "pause": "takes effect at the next denoising step",
                              "segment_s": self.segment_s, "fps": self.session.model.spec.fps}}

    async def _timeout(self) -> None:
        await asyncio.sleep(self.session_timeout_s)
        self.send("session_timeout", message=f"Session expired after {self.session_timeout_s:g} seconds")
        self.close(CLOSE_NORMAL)

    # -- incoming --------------------------------------------------------------------------------------

    max_text_bytes = MAX_DREAMVERSE_BYTES

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
        now = time.monotonic()
        if not self._admit(text, now):
            return
        try:
            data = parse_json(text, what="Dreamverse", max_bytes=MAX_DREAMVERSE_BYTES)
        except RpcError as e:
            self.refuse("bad_json", e.message, "parse_error", now)
            return
        kind = data.get("type") if isinstance(data, dict) else None
        if not isinstance(kind, str):
            self.refuse("bad_message", "expected a JSON object with a string 'type'", "invalid", now)
            return
        if kind == "append_prompt":
            try:
                prompt, truncated = clean_prompt(data.get("prompt"))
            except PromptError as e:
                self.refuse("bad_prompt", f"append_prompt requires a non-empty prompt: {e}", "invalid", now)
                return
            pid = data.get("prompt_id")
            pid = pid[:128] if isinstance(pid, str) and pid else f"wc-{time.monotonic_ns()}"
            cuts = self.director is not None and self.director.current is not None
            if not self._queue_control({"type": "append_prompt", "prompt": prompt, "prompt_id": pid}):
                return  # refused (rate limit), and told so with its prompt_id: never acknowledged
            self.guard.accepted("control", now)
            self.send("prompt_received", prompt_id=pid, queue_depth=0,
                      worldcast={"applies": "now", "cuts_segment": cuts,
                                 "truncated_to_chars": MAX_PROMPT_CHARS if truncated else None})
        elif kind == "set_generation_paused":
            paused = data.get("paused")
            if not isinstance(paused, bool):
                self.refuse("bad_message", "set_generation_paused requires a boolean 'paused'", "invalid", now)
                return
            if not self.guard.take("control", now):
                self.refuse("rate_limited", "too many set_generation_paused messages", "rate_limited", now,
                            request=kind)
                return
            self.guard.accepted("control", now)
            self._set_paused(paused)
        elif kind == "restart_generation":
            if self._queue_control({"type": "restart_generation"}):
                self.guard.accepted("control", now)
        elif kind == "leave":
            self.send("ltx2_stream_complete")
            self.close(CLOSE_NORMAL)
        elif kind == "session_init_v2":
            self.refuse("already_initialized", "session_init_v2 was already received on this socket", "invalid", now)
        elif kind in UNSUPPORTED:
            self.refuse("unsupported", f"worldcast does not serve Dreamverse's {kind!r}; it serves "
                        f"session_init_v2 and {', '.join(SUPPORTED)}", "invalid", now)
        else:
            self.refuse("unknown_type", f"unknown message type {kind[:64]!r}", "invalid", now)

    def _set_paused(self, paused: bool) -> None:
        self.user_paused = paused
        try:
            if paused:
                self.session.pause()
            elif self.director is not None and self.director.current is not None:
                self.session.resume()  # only an open segment resumes; a finished one stays finished
            else:
                self._queue_control({"type": "_next"}, limited=False)
        except SessionError as e:
            self.error("session_closed", str(e))
            return
        self.send("generation_paused_updated", paused=paused, worldcast={"applies": "next_step"})

    async def handle_control(self, obj: dict[str, Any]) -> None:
        kind = obj["type"]
        if kind == "append_prompt":
            await self._start(obj["prompt"], source="user_raw", prompt_id=obj["prompt_id"], seed_index=None)
            self.send("prompt_ready", prompt_id=obj["prompt_id"], prompt=obj["prompt"], source="user_raw",
                      latency_ms=0.0)
        elif kind == "restart_generation":
            self.next_prompt, self.segment_idx = 0, 0
            self.loop_iteration += 1
            self.send("generation_restarted", reason="cap_restart", segment_cap=0)
            self._restart_pending = True  # ltx2_stream_start goes out after the cut segment's end
            await self._next(force=True)
            if self._restart_pending:  # no prompt to start: announce the restarted stream anyway
                self._restart_pending = False
                self.send("ltx2_stream_start", **self._stream_start_fields())
        elif kind == "_next":
            await self._next()

    async def _next(self, *, force: bool = False) -> None:
        """Start the next curated prompt, unless a segment is open (or paused), or none is left."""
        if self.user_paused or (self.director is not None and self.director.current is not None and not force):
            return
        if self.next_prompt >= len(self.prompts):
            if self._blocked_at != self.segment_idx + 1:
                self._blocked_at = self.segment_idx + 1
                self.send("prompt_sources_blocked", segment_idx=self.segment_idx + 1)
            return
        i = self.next_prompt
        self.next_prompt += 1
        await self._start(self.prompts[i], source="curated", prompt_id=None, seed_index=i)

    async def _start(self, prompt: str, *, source: str, prompt_id: str | None, seed_index: int | None) -> None:
        assert self.director is not None
        try:
            context = await asyncio.get_running_loop().run_in_executor(None, self.session.encode_prompt, prompt)
        except SessionError as e:
            self.error("bad_prompt", str(e))
            return
        self.segment_idx += 1
        self._pending = DvSegment(self.segment_idx, source, prompt_id, seed_index)
        try:
            self.director.direct(str(self.segment_idx), prompt, context, duration_s=self.segment_s)
            if self.user_paused:
                self.session.pause()
        except SessionError as e:
            self.error("session_closed", str(e))
        finally:
            self._pending = None

    # -- segment events ----------------------------------------------------------------------------------

    def _segment_start(self, seg: Segment) -> None:
        dv = self._pending or DvSegment(self.segment_idx, "user_raw", None, None)
        self._segments[seg.index] = dv
        if self._restart_pending:
            self._restart_pending = False
            self.send("ltx2_stream_start", **self._stream_start_fields())
        self._blocked_at = None
        self.send("segment_prompt_source", segment_idx=dv.segment_idx, source=dv.source, prompt_id=dv.prompt_id,
                  fallback_used=False, seed_prompt_index=dv.seed_prompt_index, loop_iteration=self.loop_iteration)
        self.send("ltx2_segment_start", segment_idx=dv.segment_idx, total_segments=self._total(dv),
                  prompt=seg.prompt, source=dv.source, seed_prompt_index=dv.seed_prompt_index,
                  loop_iteration=self.loop_iteration, worldcast={"target_frames": seg.target_frames})

    def _total(self, dv: DvSegment) -> int:
        return max(dv.segment_idx, len(self.prompts))

    def _segment_complete(self, seg: Segment) -> None:
        dv = self._segments.get(seg.index)
        if dv is None:
            return
        summary = seg.summary(self.director.fps if self.director else 1.0)
        cut = seg.end == SegmentEnd.CUT

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
            out.append(dumps({"type": "ltx2_segment_complete", "segment_idx": dv.segment_idx,
                              "total_segments": self._total(dv), "cut": cut, "frames": seg.frames,
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

    def _on_state(self, session: Session, state: object) -> None:
        if state == SessionState.CLOSED:
            self.close(CLOSE_NORMAL)

    def _on_error(self, session: Session, reason: object) -> None:
        self.error(getattr(reason, "code", "session_failed"), f"AV streaming failed: {reason}")


async def serve_dreamverse(ws: WebSocket, *, manager: SessionManager, video_scale: int, segment_s: float,
                           session_timeout_s: float,
                           make_guard: Callable[[], InputGuard] = InputGuard) -> None:
    """Serve `WS /ws`: queue status, wait for session_init_v2, open a directing session, stream it.

    The session belongs to the socket: it is closed when the socket closes.
    """
    await ws.accept()
    guard = make_guard()  # from the first message: one flood verdict for everything this socket sends
    admitted = manager.admission_decision().admitted
    try:
        await ws.send_text(dumps({"type": "queue_status", "position": 0 if admitted else 1, "total_gpus": 1,
                                  "available_gpus": 1 if admitted else 0}))
        init = await _wait_init(ws, guard)
    except (WebSocketDisconnect, RuntimeError):
        return
    if init is None:
        return
    prompts, errors_ = _curated(init)
    for msg in errors_:
        await ws.send_text(dumps({"type": "error", "message": msg, "error_code": "bad_prompt"}))
    try:
        session = await manager.create(mode="directing", prompt=prompts[0] if prompts else None)
    except InvalidConditioning as e:  # e.g. a model that takes no text: nothing to direct
        await ws.send_text(dumps({"type": "error", "message": f"cannot direct this model: {e}",
                                  "error_code": "unsupported_model"}))
        await ws.close(1008)
        return
    except CapacityExhausted as e:
        await ws.send_text(dumps({"type": "error", "message": f"no GPU available: {e}", "error_code": "capacity",
                                  "retry_after_s": e.retry_after_s}))
        await ws.close(CLOSE_TRY_AGAIN_LATER)
        return
    try:
        await ws.send_text(dumps({"type": "gpu_assigned", "gpu_id": 0, "session_timeout": session_timeout_s}))
        conn = DreamverseConnection(ws, session, video_scale=video_scale,
                                    prompts=prompts, preset_id=init.get("preset_id"), segment_s=segment_s,
                                    session_timeout_s=session_timeout_s, guard=guard)
        await conn.run()
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        manager.close(session.id, CloseReason.CLIENT)


async def _wait_init(ws: WebSocket, guard: InputGuard) -> dict[str, Any] | None:
    """The session_init_v2 message; None if the client left, sent none within INIT_TIMEOUT_S (told, closed
    4408: a socket that never starts holds no session) or sent more than MAX_PRE_INIT_MESSAGES others
    (told, closed 1008). Messages before it are counted and answered through `guard` (coalesced)."""
    deadline = time.monotonic() + INIT_TIMEOUT_S
    refused = 0
    while True:
        try:
            msg = await asyncio.wait_for(ws.receive(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            await ws.send_text(dumps({"type": "error", "message": f"no session_init_v2 within {INIT_TIMEOUT_S:g} s",
                                      "error_code": "init_timeout"}))
            await ws.close(CLOSE_INIT_TIMEOUT)
            return None
        if msg["type"] == "websocket.disconnect":
            return None
        now = time.monotonic()
        raw = msg.get("text") if msg.get("text") is not None else (msg.get("bytes") or b"")
        rej = guard.admit("stream", raw, now, max_bytes=MAX_DREAMVERSE_BYTES)
        why, outcome = ("send session_init_v2 first", "invalid") if rej is None else (rej.message, rej.outcome)
        if rej is None and msg.get("text") is not None:
            try:
                data = parse_json(msg["text"], what="Dreamverse", max_bytes=MAX_DREAMVERSE_BYTES)
            except RpcError as e:
                data, why, outcome = None, e.message, "parse_error"
            if isinstance(data, dict) and data.get("type") == "session_init_v2":
                guard.accepted("stream", now)
                return data
            if isinstance(data, dict) and data.get("type") == "leave":
                await ws.close(CLOSE_NORMAL)
                return None
        refused += 1
        if refused > MAX_PRE_INIT_MESSAGES:
            await ws.send_text(dumps({"type": "error", "error_code": "flood", "message": f"more than "
                                      f"{MAX_PRE_INIT_MESSAGES} messages before session_init_v2"}))
            await ws.close(CLOSE_POLICY)
            return None
        for ev in guard.rejected_message("stream", "not_initialized", why, now, outcome=outcome):
            await ws.send_text(dumps({"type": "error", "message": ev["message"], "error_code": ev["code"],
                                      "count": ev["count"]}))


def _curated(init: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Usable curated prompts (or the initial rollout prompt) of session_init_v2, and errors for the rest."""
    raw = init.get("curated_prompts")
    raw = raw if isinstance(raw, list) else []
    if not raw and isinstance(init.get("initial_rollout_prompt"), str) and init["initial_rollout_prompt"].strip():
        raw = [init["initial_rollout_prompt"]]
    prompts, errs = [], []
    for i, p in enumerate(raw[:MAX_CURATED_PROMPTS]):
        if isinstance(p, str) and not p.strip():
            continue  # Dreamverse skips blank entries too
        try:
            prompts.append(clean_prompt(p)[0])
        except PromptError as e:
            errs.append(f"curated prompt {i + 1} skipped: {e}")
    if len(raw) > MAX_CURATED_PROMPTS:
        errs.append(f"only the first {MAX_CURATED_PROMPTS} curated prompts are used")
    return prompts, errs
