// LivePlayer: plays a live fragmented-MP4 byte stream through MediaSource and keeps to its live edge.
//
// The server's init segment declares no duration, so Chromium renders in its low-delay (live) mode;
// its timeline is gapless (docs/streaming.md), so the buffered range has no holes. Keeping live is
// the page's job (W3C Media Source Extensions leave it to the application):
// - after every append, if the newest buffered frame is more than JUMP_S ahead of the playhead
//   (a burst after a stall), seek to the live edge less TARGET_S;
// - if it is more than CATCH_UP_S ahead, play at CATCH_UP_RATE until it is back near TARGET_S;
// - trim what lies more than KEEP_BEHIND_S behind the playhead, so memory stays bounded.

/** Latency to the live edge the player aims for, s (two frames at 20 fps). */
const TARGET_S = 0.1;
/** Above this, play faster to catch up, s. */
const CATCH_UP_S = 0.15;
/** Above this, seek straight to the live edge, s. */
const JUMP_S = 0.25;
const CATCH_UP_RATE = 1.15;
/** Buffer kept behind the playhead, s. */
const KEEP_BEHIND_S = 10;
/** How often buffered media behind the playhead is trimmed, ms. */
const TRIM_EVERY_MS = 5000;

export interface LiveStats {
  mime: string | null;
  appended: number; // media segments appended
  bytes: number;
  seeks: number; // jumps to the live edge
  catchUps: number; // times playback sped up
  trims: number;
  liveLatencyMs: number | null; // newest buffered end - playhead, at the last presented frame
  maxLiveLatencyMs: number; // the largest of those since `resetMax`
  latencySamples: number;
  presented: number; // frames presented (requestVideoFrameCallback)
  errors: string[];
}

export class LivePlayer {
  readonly stats: LiveStats = {
    mime: null, appended: 0, bytes: 0, seeks: 0, catchUps: 0, trims: 0, liveLatencyMs: null,
    maxLiveLatencyMs: 0, latencySamples: 0, presented: 0, errors: [],
  };
  private ms: MediaSource | null = null;
  private sb: SourceBuffer | null = null;
  private pending: ArrayBuffer[] = [];
  private lastTrim = 0;
  private objectUrl: string | null = null;
  private closed = false;

  constructor(private readonly video: HTMLVideoElement) {
    const onFrame = () => {
      if (this.closed) return;
      this.stats.presented += 1;
      this.sample();
      this.video.requestVideoFrameCallback(onFrame);
    };
    if ("requestVideoFrameCallback" in video) video.requestVideoFrameCallback(onFrame);
  }

  /** Start a MediaSource for `mime` (from the stream's media_init event). */
  open(mime: string): void {
    if (this.ms) return;
    if (!MediaSource.isTypeSupported(mime)) {
      this.stats.errors.push(`MediaSource does not support ${mime}`);
      return;
    }
    this.stats.mime = mime;
    const ms = new MediaSource();
    this.ms = ms;
    this.objectUrl = URL.createObjectURL(ms);
    this.video.src = this.objectUrl;
    ms.addEventListener("sourceopen", () => {
      const sb = ms.addSourceBuffer(mime);
      sb.mode = "segments"; // the server's timeline is gapless: its own timestamps are right
      sb.addEventListener("updateend", () => this.afterAppend());
      sb.addEventListener("error", () => this.stats.errors.push("SourceBuffer error"));
      this.sb = sb;
      this.pump();
    }, { once: true });
  }

  /** Queue a binary message of the stream (the init segment or a media segment). */
  append(data: ArrayBuffer): void {
    if (this.closed) return;
    this.pending.push(data);
    this.stats.bytes += data.byteLength;
    this.pump();
  }

  private pump(): void {
    const sb = this.sb;
    if (!sb || sb.updating || this.pending.length === 0) return;
    try {
      sb.appendBuffer(this.pending.shift()!);
      this.stats.appended += 1;
    } catch (e) {
      this.stats.errors.push(`appendBuffer: ${(e as Error).message}`);
    }
  }

  private liveEdge(): number | null {
    const b = this.video.buffered;
    return b.length ? b.end(b.length - 1) : null;
  }

  private afterAppend(): void {
    const edge = this.liveEdge();
    const v = this.video;
    if (edge !== null) {
      if (v.paused && !this.closed) v.play().catch(() => {}); // muted autoplay is allowed
      const behind = edge - v.currentTime;
      if (behind > JUMP_S || v.currentTime < v.buffered.start(0)) {
        v.currentTime = Math.max(v.buffered.start(v.buffered.length - 1), edge - TARGET_S);
        v.playbackRate = 1;
        this.stats.seeks += 1;
      } else if (behind > CATCH_UP_S) {
        if (v.playbackRate === 1) this.stats.catchUps += 1;
        v.playbackRate = CATCH_UP_RATE;
      } else if (behind <= TARGET_S) {
        v.playbackRate = 1;
      }
    }
    this.trim();
    this.pump();
  }

  private trim(): void {
    const sb = this.sb;
    const now = performance.now();
    if (!sb || sb.updating || this.pending.length > 0 || now - this.lastTrim < TRIM_EVERY_MS) return;
    this.lastTrim = now;
    const b = this.video.buffered;
    const until = this.video.currentTime - KEEP_BEHIND_S;
    if (b.length && until > b.start(0)) {
      sb.remove(b.start(0), until);
      this.stats.trims += 1;
    }
  }

  /** Latency to the live edge as the viewer sees it: at each presented frame. */
  private sample(): void {
    const edge = this.liveEdge();
    if (edge === null) return;
    const ms = Math.max(0, (edge - this.video.currentTime) * 1000);
    this.stats.liveLatencyMs = Math.round(ms);
    this.stats.maxLiveLatencyMs = Math.max(this.stats.maxLiveLatencyMs, Math.round(ms));
    this.stats.latencySamples += 1;
  }

  /** Start measuring the maximum afresh (after start-up). */
  resetMax(): void {
    this.stats.maxLiveLatencyMs = 0;
    this.stats.latencySamples = 0;
  }

  close(): void {
    this.closed = true;
    this.pending = [];
    if (this.ms && this.ms.readyState === "open") {
      try {
        this.ms.endOfStream();
      } catch {
        // already ended
      }
    }
    this.video.removeAttribute("src");
    this.video.load();
    if (this.objectUrl) URL.revokeObjectURL(this.objectUrl);
    this.ms = null;
    this.sb = null;
  }
}
