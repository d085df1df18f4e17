// The directing page: a directing session over the WebSocket stream, played through MediaSource.
//
// Start creates a session ({"mode": "directing"}), opens /v1/sessions/{id}/stream, authenticates with
// a first message (browsers cannot set WebSocket headers) and plays the fMP4 it receives with
// LivePlayer (mse.ts). Each direction typed in the box starts a segment; one sent during a segment
// cuts it. The timeline shows every segment: its prompt, frames, time to first frame, cut or finished.
// Clicking a segment in the timeline picks it to be taken again: the next direction sends `from_segment`,
// the server puts the world back where that segment began, and the segments from it on are abandoned (shown
// struck out). Record (ticked at Start) records the session; Film and Events download it (download.ts).

import { downloadRecording } from "./download";
import { LivePlayer, type LiveStats } from "./mse";
import type {
  AuthMessage,
  DirectionAckEvent,
  DirectionMessage,
  MediaEvent,
  SegmentCompleteEvent,
  SegmentStartEvent,
  StreamEvent,
} from "./streamProtocol";

/** Overlay refresh period, ms. */
const OVERLAY_MS = 250;

interface SegmentRow {
  segment: number;
  directionId: string;
  prompt: string;
  sentMs: number | null; // performance.now() when its direction was sent
  ttffMs: number | null; // direction sent -> its first media segment received
  frames: number;
  end: string | null; // finished, cut, stopped; null while it plays
  retakeOf: number | null; // the segment it took again
  abandoned: boolean; // a later direction took an earlier segment again
}

interface DirectStats {
  connected: boolean;
  streaming: boolean; // stream_start arrived
  sessionId: string | null;
  state: string; // the session's state events ("active", "idle", ...)
  mediaSegments: number;
  lastFrameIndex: number;
  segments: SegmentRow[];
  player: LiveStats | null;
  errors: string[];
  retakeFrom: number | null; // the segment the next direction takes again
}

declare global {
  interface Window {
    __worldcastDirect: DirectStats;
    /** Start measuring the live-edge maximum afresh (tests call it after start-up). */
    __worldcastDirectResetMax: () => void;
  }
}

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const video = $<HTMLVideoElement>("video");
const overlay = $<HTMLPreElement>("stats");
const startBtn = $<HTMLButtonElement>("start");
const direction = $<HTMLInputElement>("direction");
const durationSel = $<HTMLSelectElement>("duration");
const directBtn = $<HTMLButtonElement>("direct");
const timeline = $<HTMLDivElement>("timeline");
const status = $<HTMLElement>("status");
const recordBox = $<HTMLInputElement>("record");
const filmLink = $<HTMLAnchorElement>("download-film");
const eventsLink = $<HTMLAnchorElement>("download");

const stats: DirectStats = {
  connected: false, streaming: false, sessionId: null, state: "disconnected", mediaSegments: 0, lastFrameIndex: -1, segments: [],
  player: null, errors: [], retakeFrom: null,
};
window.__worldcastDirect = stats;
window.__worldcastDirectResetMax = () => player?.resetMax();

let ws: WebSocket | null = null;
let token: string | null = null;
let player: LivePlayer | null = null;
let nextId = 0;
const sentAt = new Map<string, number>();
let expectBinary: "init" | "media" | null = null;
/** The last recorded session: its film and log stay downloadable after it closes (the retention time). */
let recorded: { id: string; token: string } | null = null;

function say(text: string): void {
  status.textContent = text;
}

function setConnected(on: boolean): void {
  stats.connected = on;
  startBtn.textContent = on ? "Stop" : "Start";
  startBtn.disabled = false;
  directBtn.disabled = !on;
}

function row(segment: number): SegmentRow | undefined {
  return stats.segments.find((s) => s.segment === segment);
}

// -- incoming ------------------------------------------------------------------------------------

function onEvent(ev: StreamEvent): void {
  switch (ev.event) {
    case "stream_start":
      stats.streaming = true;
      say(`session ${ev.session_id} · ${ev.model} @ ${ev.fps} fps · type a direction`);
      break;
    case "media_init":
      player?.open(ev.mime);
      expectBinary = "init";
      break;
    case "media": {
      const m = ev as MediaEvent;
      expectBinary = "media";
      stats.mediaSegments += 1;
      stats.lastFrameIndex = m.frame_index;
      const r = m.segment === null ? undefined : row(m.segment);
      if (r) {
        r.frames += 1;
        if (r.ttffMs === null && r.sentMs !== null) r.ttffMs = Math.round(performance.now() - r.sentMs);
      }
      break;
    }
    case "direction_ack": {
      const a = ev as DirectionAckEvent;
      if (a.retake_of !== null) { // the take from that segment on is abandoned
        for (const r of stats.segments) if (r.segment >= a.retake_of) r.abandoned = true;
      }
      stats.segments.push({ segment: a.segment, directionId: String(a.id), prompt: "", frames: 0, end: null,
        sentMs: sentAt.get(String(a.id)) ?? null, ttffMs: null, retakeOf: a.retake_of, abandoned: false });
      renderTimeline();
      break;
    }
    case "segment_start": {
      const s = ev as SegmentStartEvent;
      const r = row(s.segment);
      if (r) r.prompt = s.prompt;
      renderTimeline();
      break;
    }
    case "segment_complete": {
      const c = ev as SegmentCompleteEvent;
      const r = row(c.segment);
      if (r) {
        r.end = c.end;
        r.frames = c.frames;
      }
      renderTimeline();
      break;
    }
    case "state":
      stats.state = ev.state;
      if (ev.state === "closed") stop("the server closed the session");
      break;
    case "error":
      stats.errors.push(`${ev.code}: ${ev.message}`);
      say(`server error (${ev.code}): ${ev.message}`);
      break;
  }
}

function onMessage(e: MessageEvent): void {
  if (typeof e.data === "string") {
    let ev: StreamEvent;
    try {
      ev = JSON.parse(e.data) as StreamEvent;
    } catch {
      stats.errors.push("a text message that is not JSON");
      return;
    }
    if ("event" in ev) onEvent(ev);
    return;
  }
  if (expectBinary === null) {
    stats.errors.push("binary message before media_init");
    return;
  }
  player?.append(e.data as ArrayBuffer);
  expectBinary = null;
}

// -- segments -------------------------------------------------------------------------------------

function renderTimeline(): void {
  timeline.replaceChildren(...stats.segments.map((s) => {
    const el = document.createElement("div");
    el.className = `seg ${s.end ?? "playing"}${s.abandoned ? " abandoned" : ""}` +
      `${stats.retakeFrom === s.segment ? " picked" : ""}`;
    el.style.flexGrow = String(Math.max(1, s.frames));
    el.title = `${s.prompt}\n${s.frames} frames${s.ttffMs !== null ? `, first frame after ${s.ttffMs} ms` : ""}` +
      (s.abandoned ? "\n(abandoned: an earlier segment was taken again)" : "\nclick: take this segment again");
    el.textContent = `${s.segment}${s.retakeOf !== null ? ` ↺${s.retakeOf}` : ""} · ${s.prompt || "…"}` +
      `${s.end === "cut" ? " ✂" : ""}`;
    el.dataset.segment = String(s.segment);
    el.dataset.end = s.end ?? "";
    if (!s.abandoned) el.onclick = () => pickRetake(s);
    return el;
  }));
}

/** Pick `s` as the segment the next direction takes again (its own prompt offered), or unpick it. */
function pickRetake(s: SegmentRow): void {
  stats.retakeFrom = stats.retakeFrom === s.segment ? null : s.segment;
  if (stats.retakeFrom !== null && !direction.value.trim()) direction.value = s.prompt;
  directBtn.textContent = stats.retakeFrom === null ? "Direct" : `Take ${s.segment} again`;
  say(stats.retakeFrom === null ? "type a direction" :
    `the next direction takes segment ${s.segment} again from where it began (click it again to cancel)`);
  renderTimeline();
}

function sendDirection(): void {
  const prompt = direction.value.trim();
  if (!ws || ws.readyState !== WebSocket.OPEN || !prompt) return;
  const id = `b${++nextId}`;
  const msg: DirectionMessage = { type: "direction", id, prompt };
  const d = durationSel.value;
  msg.duration_s = d === "open" ? null : Number(d);
  if (stats.retakeFrom !== null) msg.from_segment = stats.retakeFrom;
  stats.retakeFrom = null;
  directBtn.textContent = "Direct";
  sentAt.set(id, performance.now());
  ws.send(JSON.stringify(msg));
  direction.value = "";
  say(`direction ${id} sent (${prompt.length} characters)`);
}

// -- connection -------------------------------------------------------------------------------------

async function start(): Promise<void> {
  startBtn.disabled = true;
  say("creating a directing session…");
  stats.segments = [];
  stats.errors = [];
  stats.mediaSegments = 0;
  stats.retakeFrom = null;
  renderTimeline();
  try {
    const r = await fetch("/v1/sessions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(recordBox.checked ? { mode: "directing", record: true } : { mode: "directing" }),
    });
    if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
    const s = (await r.json()) as { session_id: string; token: string };
    stats.sessionId = s.session_id;
    token = s.token;
    if (recordBox.checked) {
      recorded = { id: s.session_id, token: s.token };
      filmLink.hidden = eventsLink.hidden = false;
    }
  } catch (e) {
    say(`could not create a session: ${(e as Error).message}`);
    setConnected(false);
    return;
  }
  player = new LivePlayer(video);
  stats.player = player.stats;
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const sock = new WebSocket(`${proto}//${location.host}/v1/sessions/${stats.sessionId}/stream`);
  sock.binaryType = "arraybuffer";
  ws = sock;
  sock.onopen = () => {
    const auth: AuthMessage = { type: "auth", token: token! };
    sock.send(JSON.stringify(auth)); // the token never goes in the URL
    setConnected(true);
  };
  sock.onmessage = onMessage;
  sock.onclose = (e) => {
    if (ws === sock) stop(`stream closed (${e.code}${e.reason ? ` ${e.reason}` : ""})`);
  };
}

function stop(why = "stopped"): void {
  const sock = ws;
  ws = null;
  sock?.close();
  player?.close();
  if (stats.sessionId && token) {
    fetch(`/v1/sessions/${stats.sessionId}`, {
      method: "DELETE", headers: { Authorization: `Bearer ${token}` }, keepalive: true,
    }).catch(() => {});
  }
  token = null;
  stats.streaming = false;
  stats.state = "disconnected";
  setConnected(false);
  say(why);
}

function renderOverlay(): void {
  const p = player?.stats;
  const cur = stats.segments.length ? stats.segments[stats.segments.length - 1] : undefined;
  overlay.textContent = [
    `segment ${cur ? `${cur.segment} (${cur.end ?? "playing"})` : "-"}  frame ${stats.lastFrameIndex}`,
    `live edge ${p?.liveLatencyMs ?? "-"} ms (max ${p?.maxLiveLatencyMs ?? "-"})`,
    `seeks ${p?.seeks ?? 0}  catch-ups ${p?.catchUps ?? 0}  ${((p?.bytes ?? 0) / 1024).toFixed(0)} KiB`,
    cur?.ttffMs != null ? `first frame ${cur.ttffMs} ms after the direction` : "",
  ].join("\n");
}

startBtn.onclick = () => void (ws ? stop() : start());
for (const [link, part] of [[eventsLink, "events"], [filmLink, "film"]] as const) {
  link.onclick = (ev) => {
    ev.preventDefault();
    if (recorded) downloadRecording(recorded.id, recorded.token, part).catch((e: unknown) => say((e as Error).message));
  };
}
directBtn.onclick = () => sendDirection();
direction.addEventListener("keydown", (e) => {
  if (e.key === "Enter") sendDirection();
});
window.addEventListener("pagehide", () => stop());
video.muted = true;
setConnected(false);
setInterval(() => {
  renderOverlay();
  if (stats.segments.some((s) => s.end === null)) renderTimeline(); // the playing segment grows
}, OVERLAY_MS);
