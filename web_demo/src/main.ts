// The demo page: connect, show the video, drive it with keys and mouse, change the prompt.

import { WorldcastClient } from "./client";
import { InputState } from "./input";
import { StatsTracker, type Stats } from "./stats";
import type { ServerEvent } from "./protocol";

/** Action messages per second while a key is held or the mouse moves. */
const ACTION_HZ = 60;

declare global {
  interface Window {
    __worldcast: Stats;
  }
}

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const video = $<HTMLVideoElement>("video");
const overlay = $<HTMLPreElement>("stats");
const connectBtn = $<HTMLButtonElement>("connect");
const promptInput = $<HTMLInputElement>("prompt");
const promptBtn = $<HTMLButtonElement>("set-prompt");
const status = $<HTMLSpanElement>("status");

const stats = new StatsTracker();
window.__worldcast = stats.s;
let client: WorldcastClient | null = null;
const input = new InputState(video, () => client !== null);

function say(text: string): void {
  status.textContent = text;
}

function sendAction(): void {
  if (!client) return;
  stats.sent(client.sendAction(input.keys(), input.takeMouse()));
}

input.onChange = sendAction; // key down/up goes out at once
setInterval(() => {
  if (client && input.busy) sendAction();
}, 1000 / ACTION_HZ);

function onEvent(ev: ServerEvent): void {
  switch (ev.event) {
    case "frame":
      stats.frame(ev);
      break;
    case "state":
      stats.s.state = ev.state;
      break;
    case "error":
    case "action_rejected":
      stats.s.errors.push(ev.message);
      say(`server: ${ev.message}`);
      break;
  }
}

function countVideoFrames(): void {
  const v = video as HTMLVideoElement & { requestVideoFrameCallback?: (cb: () => void) => number };
  if (!v.requestVideoFrameCallback) return;
  const tick = () => {
    stats.s.videoFrames += 1;
    v.requestVideoFrameCallback!(tick);
  };
  v.requestVideoFrameCallback(tick);
}

async function connect(): Promise<void> {
  connectBtn.disabled = true;
  say("connecting…");
  const c = new WorldcastClient();
  c.onEvent = onEvent;
  c.onTrack = (stream) => {
    video.srcObject = stream;
    void video.play().catch(() => {});
  };
  try {
    const session = await c.connect(promptInput.value.trim() || undefined);
    client = c;
    stats.s.connected = true;
    stats.s.state = "active";
    promptInput.placeholder = session.model.default_prompt;
    say(`session ${session.session_id} · ${session.model.name} · click the video to steer with the mouse`);
    connectBtn.textContent = "Disconnect";
    connectBtn.disabled = false;
    connectBtn.onclick = disconnect;
    c.pc.onconnectionstatechange = () => {
      if (c.pc.connectionState === "failed" || c.pc.connectionState === "closed") disconnect();
    };
  } catch (e) {
    c.close();
    say(`could not connect: ${(e as Error).message}`);
    connectBtn.disabled = false;
  }
}

function disconnect(): void {
  client?.close();
  client = null;
  stats.s.connected = false;
  stats.s.state = "disconnected";
  connectBtn.textContent = "Connect";
  connectBtn.onclick = () => void connect();
  say("disconnected");
}

async function rpc(method: "flush" | "cancel" | "pause" | "resume"): Promise<void> {
  if (!client) return;
  try {
    await client.rpc(method);
  } catch (e) {
    say((e as Error).message);
  }
}

async function setPrompt(): Promise<void> {
  const text = promptInput.value.trim();
  if (!client || !text) return;
  try {
    await client.rpc("set_prompt", { prompt: text });
    await client.rpc("flush");
    say(`prompt: ${text}`);
  } catch (e) {
    say((e as Error).message);
  }
}

connectBtn.onclick = () => void connect();
promptBtn.onclick = () => void setPrompt();
promptInput.addEventListener("keydown", (e) => {
  if (e.key === "Enter") void (client ? setPrompt() : connect());
});
for (const m of ["flush", "cancel", "pause", "resume"] as const) {
  $<HTMLButtonElement>(m).onclick = () => void rpc(m);
}
window.addEventListener("pagehide", () => client?.close());
countVideoFrames();
setInterval(() => stats.render(overlay), 250);
