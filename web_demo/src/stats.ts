// Live numbers for the overlay; the same object is window.__worldcast for tests.

import type { FrameEvent } from "./protocol";

export interface Stats {
  state: string; // "disconnected", "connecting", or the session's state event ("active", "idle", ...)
  connected: boolean;
  sessionId: string | null;
  framesReceived: number; // frame events on the control channel
  lastFrameIndex: number;
  epoch: number; // flush epoch of the last frame
  lastAppliedSeq: number; // highest action_seq seen in a frame event (-1: none)
  lastSentSeq: number; // seq of the last action message sent (-1: none)
  lastSentKeys: string[]; // keys held in that message
  lastSentAxes: Record<string, number>; // axes off their rest in that message
  fps: number; // frame events in the last second
  lagMs: number | null; // action->frame: mean over the seqs N a frame newly covers of (frame event
  //                       arrival - send time of seq N), i.e. first frame with action_seq >= N
  lagMaxMs: number | null; // the largest of those (the oldest seq covered)
  timingsMs: { queue: number; denoise: number; decode: number } | null; // server stages, last frame
  videoFrames: number; // frames presented by the <video> element (requestVideoFrameCallback)
  rejected: number; // action_rejected events
  errors: string[]; // server error and rejection messages, newest last
}

/** Action send times kept for the lag measurement, at most (~30 s at 60 Hz). */
const MAX_PENDING_SEQS = 2000;
/** Window of the fps count, ms. */
const FPS_WINDOW_MS = 1000;

function initial(): Stats {
  return {
    state: "disconnected", connected: false, sessionId: null, framesReceived: 0, lastFrameIndex: -1,
    epoch: 0, lastAppliedSeq: -1, lastSentSeq: -1, lastSentKeys: [], lastSentAxes: {}, fps: 0, lagMs: null, lagMaxMs: null,
    timingsMs: null, videoFrames: 0, rejected: 0, errors: [],
  };
}

export class StatsTracker {
  readonly s: Stats = initial();
  private sentAt = new Map<number, number>(); // seq -> performance.now() ms, seqs not yet applied
  private arrivals: number[] = []; // frame event arrival times in the fps window, ms

  /** Start over for a new session (keeps the object, so window.__worldcast stays valid). */
  reset(): void {
    Object.assign(this.s, initial());
    this.sentAt.clear();
    this.arrivals = [];
  }

  sent(seq: number, keys: string[], axes: Record<string, number> = {}): void {
    if (seq < 0) return;
    this.s.lastSentSeq = seq;
    this.s.lastSentKeys = keys;
    this.s.lastSentAxes = axes;
    this.sentAt.set(seq, performance.now());
    if (this.sentAt.size > MAX_PENDING_SEQS) this.sentAt.delete(this.sentAt.keys().next().value as number);
  }

  frame(ev: FrameEvent): void {
    const now = performance.now();
    const s = this.s;
    s.framesReceived += 1;
    s.lastFrameIndex = ev.frame_index;
    s.epoch = ev.epoch;
    s.timingsMs = ev.timings_ms;
    if (ev.action_seq > s.lastAppliedSeq) {
      // This is the first frame event with action_seq >= N for every pending N <= action_seq.
      let sum = 0;
      let n = 0;
      let max = 0;
      for (const [seq, t] of this.sentAt) {
        if (seq > ev.action_seq) continue;
        sum += now - t;
        max = Math.max(max, now - t);
        n += 1;
        this.sentAt.delete(seq);
      }
      if (n > 0) {
        s.lagMs = sum / n;
        s.lagMaxMs = max;
      }
      s.lastAppliedSeq = ev.action_seq;
    }
    this.arrivals.push(now);
    this.updateFps(now);
  }

  error(message: string): void {
    this.s.errors.push(message);
    if (this.s.errors.length > 20) this.s.errors.shift();
  }

  private updateFps(now: number): void {
    while (this.arrivals.length && this.arrivals[0] < now - FPS_WINDOW_MS) this.arrivals.shift();
    this.s.fps = this.arrivals.length;
  }

  render(el: HTMLElement): void {
    this.updateFps(performance.now());
    const s = this.s;
    const t = s.timingsMs;
    const ms = (x: number | null | undefined) => (x === null || x === undefined ? "-" : `${x.toFixed(0)} ms`);
    const ms1 = (x: number | undefined) => (x === undefined ? "-" : x.toFixed(1));
    el.textContent = [
      `state      ${s.state}`,
      `fps        ${s.fps}`,
      `frames     ${s.framesReceived} (video ${s.videoFrames}) #${s.lastFrameIndex} epoch ${s.epoch}`,
      `action seq applied ${s.lastAppliedSeq} / sent ${s.lastSentSeq}` + (s.rejected ? ` (${s.rejected} rejected)` : ""),
      `action→frame ${ms(s.lagMs)} (max ${ms(s.lagMaxMs)})`,
      t ? `server ms  queue ${ms1(t.queue)} denoise ${ms1(t.denoise)} decode ${ms1(t.decode)}` : "server ms  -",
    ].join("\n");
  }
}
