"""What Dreamverse's client reads: the directing layer's events and the stream's media as Dreamverse messages.

The outgoing half of the `/ws` protocol (`connection.py` is the incoming half, the adapter that drives the
directing layer). `DreamverseEvents` owns every message the client waits for and its order, with the field
names of FastVideo's `apps/dreamverse/web/src/lib/ws/protocol.ts` and `reducer.ts` (read, not copied):

- a project's start: `loop_generation_updated`, `generation_paused_updated`, `seed_prompts_updated`
  {reason: init} (or a rewrite's events, for a custom start);
- a rollout's start: `ltx2_stream_start` and why (`seed_prompts_reset_applied` {reason} or `loop_restarted`),
  held back while a segment is open and sent just before the next one; `ltx2_stream_complete` once per
  stream (the segment cap, `leave`, `end_project_keep_session`);
- a rewrite: `rewrite_seed_prompts_started`, `seed_prompts_updated` {reason: rewrite},
  `rewrite_seed_prompts_complete`;
- per segment: `prompt_sources_resumed` (after `prompt_sources_blocked`), `segment_prompt_source`,
  `ltx2_segment_start`; its own fMP4 (`media_init` {mime, stream_id}, the init segment, then one media
  segment per frame, each segment's timeline from 0); then `media_segment_complete` {chunks},
  `step_complete` {latency_ms}, `ltx2_segment_complete` {frames: delivered, dropped, cut};
- `error` {message, error_code}, the connection guard's refusals and flood verdict among them.

Where worldcast does better, a message says so in a `worldcast` field, which the client ignores.
Event-loop only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worldcast.sessions.directing import DirectingSession, Segment, SegmentEnd
from worldcast.sessions.projects import REWRITE_RULE, Project
from worldcast.transport.dreamverse.prompts import REWRITE_MODEL, ProjectInit
from worldcast.transport.errors import QueueOverflow
from worldcast.transport.stream.fmp4 import Fmp4Fragmenter
from worldcast.transport.stream.queue import MediaItem, Render
from worldcast.transport.stream.socket import StreamSocket, dumps


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


class DreamverseEvents:
    """The Dreamverse messages of one connection, built from its project, its directing session and its stream.

    Args:
        out: the connection's stream socket (what is sent, in order; its sink, queue and frame account).
        director: the directing layer over the session.
        project: the connection's project (seeds, rollout, cap).
        segment_s: segment length, s (announced in `ltx2_stream_start`).
        queue_control: queues a request for the connection's control loop (`{"type": "_next"}` after a
            segment finished).
    """

    def __init__(self, out: StreamSocket, director: DirectingSession, project: Project, *, segment_s: float,
                 queue_control: Callable[..., bool]) -> None:
        self.out, self.director, self.project, self.segment_s = out, director, project, segment_s
        self._queue_control = queue_control
        self.errors_sent = 0
        self.pending: DvSegment | None = None  #: meta of the segment the adapter is about to open
        self.blocked_at: int | None = None  #: the segment `prompt_sources_blocked` was sent for
        self.announce_pending: list[dict[str, Any]] | None = None  #: a rollout's start, sent before its segment
        self._segments: dict[int, DvSegment] = {}  #: director segment index -> Dreamverse meta
        self._media_segment: int | None = None  #: director segment whose media is being sent
        self._seg_fragmenter: Fmp4Fragmenter | None = None
        self._init_sent_for: object | None = None
        self._stream_open = False  #: ltx2_stream_start sent, ltx2_stream_complete not since

    def send(self, kind: str, **fields: Any) -> None:
        """Queue a Dreamverse message `{"type": kind, **fields}` (a field cannot override the type)."""
        self.out.send_json({**fields, "type": kind})

    def error(self, code: str, message: str, **fields: Any) -> None:
        """Dreamverse's error shape: {type: "error", message}, plus our `error_code`."""
        self.errors_sent += 1
        self.send("error", message=message, error_code=code, **fields)

    def feedback(self, event: dict[str, Any]) -> None:
        """The guard's events in Dreamverse's shape: `error` {message, error_code, ...}; the flood verdict
        is an `error` with error_code "flood" (the socket then closes 1008)."""
        ev = dict(event)
        kind = ev.pop("event", None)
        if kind == "disconnect":
            self.send("error", message=ev.get("message", "flood"), error_code="flood")
            return
        code = ev.pop("code", "error") if kind == "error" else str(kind)
        self.send("error", message=ev.pop("message", ""), error_code=code, **ev)

    # -- a project's rollouts ---------------------------------------------------------------------------

    def project_started(self, init: ProjectInit, *, first: bool) -> None:
        """A project began (`project.begin(init)`): its start-up events, in the client's order (a custom start
        is announced as rewritten into seeds, as Dreamverse's LLM would)."""
        p = self.project
        for msg in init.errors:
            self.error("bad_prompt", msg)
        self.send("loop_generation_updated", enabled=p.loop)
        if init.initial_prompt is not None:
            self.send("generation_paused_updated", paused=True)  # waiting for the rollout's rewrite
            self.rewrite(init.initial_prompt)
            self.send("generation_paused_updated", paused=False)
            self.announce("initial_rewrite")
        else:
            self.send("generation_paused_updated", paused=False)
            self.announce(None if first else "project_init")
            self.send("seed_prompts_updated", prompts=p.seeds, preset_id=p.preset_id, preset_label=p.preset_label,
                      reason="init", seed_prompt_count=len(p.seeds))

    def rewrite(self, instruction: str | None) -> None:
        """The events of a rule-based rewrite of the seeds (now `project.seeds`)."""
        p = self.project
        self.send("rewrite_seed_prompts_started", model=REWRITE_MODEL)
        common = {"preset_id": p.preset_id, "preset_label": p.preset_label, "fallback_used": False, "error": None,
                  "model": REWRITE_MODEL, "latency_ms": 0.0}
        self.send("seed_prompts_updated", prompts=p.seeds, reason="rewrite", raw_llm_output=None,
                  rewrite_instruction=instruction or "", seed_prompt_count=len(p.seeds), **common,
                  worldcast={"rule": REWRITE_RULE})
        self.send("rewrite_seed_prompts_complete", **common)

    def _stream_start_fields(self) -> dict[str, Any]:
        p = self.project
        return {"total_segments": len(p.seeds), "preset_id": p.preset_id, "stream_mode": "av_fmp4",
                "live_mode": True, "loop_generation_enabled": p.loop, "loop_iteration": p.rollout,
                "generation_segment_cap": p.cap,
                "worldcast": {"new_prompt": "cuts the current segment at the next denoising step",
                              "pause": "takes effect at the next denoising step",
                              "segment_s": self.segment_s, "fps": self.out.session.model.spec.fps}}

    def announce(self, reason: str | None) -> None:
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
        if self.director.current is None:
            self.announce_pending = None
            self._send_announcement(msgs)
        else:
            self.announce_pending = msgs

    def send_pending_announcement(self) -> None:
        """Send a held-back rollout start now (nothing if none is held)."""
        if self.announce_pending is not None:
            self._send_announcement(self.announce_pending)
            self.announce_pending = None

    def _send_announcement(self, msgs: list[dict[str, Any]]) -> None:
        self._stream_open = True
        for m in msgs:
            self.out.send_json(m)

    def stream_complete(self) -> None:
        """`ltx2_stream_complete`, once per started stream."""
        if self._stream_open:
            self._stream_open = False
            self.send("ltx2_stream_complete")

    def blocked(self, segment_idx: int) -> None:
        """No prompt is left for segment `segment_idx`: `prompt_sources_blocked`, once per segment."""
        if self.blocked_at != segment_idx:
            self.blocked_at = segment_idx
            self.send("prompt_sources_blocked", segment_idx=segment_idx)

    # -- media ----------------------------------------------------------------------------------------------

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

    # -- segment events ----------------------------------------------------------------------------------

    def segment_start(self, seg: Segment) -> None:
        p = self.project
        dv = self.pending or DvSegment(p.started, "user_raw", None, None)
        self._segments[seg.index] = dv
        self.send_pending_announcement()
        if self.blocked_at is not None:
            self.blocked_at = None
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
        summary = seg.summary(self.director.fps)
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
            sent, dropped = self.out.frames.segment(seg.index)  # final: its media were sent or dropped
            out.append(dumps({"type": "ltx2_segment_complete", "segment_idx": dv.segment_idx,
                              "total_segments": total, "cut": cut, "frames": sent, "dropped": dropped,
                              "worldcast": {"end": summary["end"], "ttff_ms": t.get("ttff")}}))
            if seg.end == SegmentEnd.FINISHED:  # every frame of it has been sent: the next prompt's flush drops none
                self._queue_control({"type": "_next"}, limited=False)
            return out

        def enqueue() -> None:
            try:
                self.out.queue.put_control(Render(render))
            except QueueOverflow:
                self.out.close()

        if seg.end == SegmentEnd.FINISHED:  # after its last frames have left the encoder
            self.out.sink.when_done(enqueue)
        else:
            enqueue()
