// Live numbers for the overlay, and window.__worldcast for tests.

import type { FrameEvent } from "./protocol";

export interface Stats {
  state: string;
  connected: boolean;
  framesReceived: number;
  lastFrameIndex: number;
  lastAppliedSeq: number;
  lastSentSeq: number;
  fps: number;
  lagMs: number | null; // send of action seq N -> first frame event with action_seq >= N
  timingsMs: { queue: number; denoise: number; commit: number } | null;
  videoFrames: number; // frames painted by the <video> element
  errors: string[];
}

export class StatsTracker {
  readonly s: Stats = {
    state: "disconnected", connected: false, framesReceived: 0, lastFrameIndex: -1, lastAppliedSeq: -1,
    lastSentSeq: -1, fps: 0, lagMs: null, timingsMs: null, videoFrames: 0, errors: [],
  };
  private sentAt = new Map<number, number>(); // seq -> performance.now() ms
  private arrivals: number[] = [];

  sent(seq: number): void {
    this.s.lastSentSeq = seq;
    this.sentAt.set(seq, performance.now());
    if (this.sentAt.size > 2000) this.sentAt.delete(this.sentAt.keys().next().value as number);
  }

  frame(ev: FrameEvent): void {
    const now = performance.now();
    this.s.framesReceived += 1;
    this.s.lastFrameIndex = ev.frame_index;
    this.s.timingsMs = ev.timings_ms;
    if (ev.action_seq > this.s.lastAppliedSeq) {
      const t = this.sentAt.get(ev.action_seq);
      if (t !== undefined) this.s.lagMs = now - t;
      for (const k of this.sentAt.keys()) if (k <= ev.action_seq) this.sentAt.delete(k);
      this.s.lastAppliedSeq = ev.action_seq;
    }
    this.arrivals.push(now);
    while (this.arrivals.length && this.arrivals[0] < now - 1000) this.arrivals.shift();
    this.s.fps = this.arrivals.length;
  }

  render(el: HTMLElement): void {
    const s = this.s;
    const t = s.timingsMs;
    el.textContent = [
      `state      ${s.state}`,
      `fps        ${s.fps}`,
      `frames     ${s.framesReceived} (video ${s.videoFrames})`,
      `applied    seq ${s.lastAppliedSeq} / sent ${s.lastSentSeq}`,
      `action→frame ${s.lagMs === null ? "-" : s.lagMs.toFixed(0) + " ms"}`,
      t ? `server     denoise ${t.denoise.toFixed(1)} commit ${t.commit.toFixed(1)} queue ${t.queue.toFixed(1)} ms` : "",
    ].join("\n");
  }
}
