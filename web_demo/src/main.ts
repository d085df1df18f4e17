// The demo page: connect, show the video, drive it with keys, mouse or a gamepad, change the prompt.

import { WorldcastClient } from "./client";
import { InputState } from "./input";
import type { SessionClient } from "./livekit";
import type { ModelInfo, ServerEvent, StartRequest } from "./protocol";
import { StatsTracker, type Stats } from "./stats";
import { downloadRecording } from "./download";

/** Action messages per second while a key is held, a stick is off centre or the mouse moves. */
const ACTION_HZ = 60;
/** Keep repeating the held-key state this long after the last input, ms: the actions channel
 * drops lost messages, and a lost key-up would otherwise leave the key held on the server. */
const REPEAT_AFTER_INPUT_MS = 250;
/** Overlay refresh period, ms. */
const OVERLAY_MS = 250;

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
const status = $<HTMLElement>("status");
const transportSel = $<HTMLSelectElement>("transport");
const roomInput = $<HTMLInputElement>("room");
const imageInput = $<HTMLInputElement>("image");
const keysHelp = $<HTMLElement>("keys-help");
const recordBox = $<HTMLInputElement>("record");
const shareBtn = $<HTMLButtonElement>("share");
const watchLink = $<HTMLAnchorElement>("watch-link");
const downloadLink = $<HTMLAnchorElement>("download");
const filmLink = $<HTMLAnchorElement>("download-film");
/** The last recorded session's id and token: its log stays downloadable after it closes (the retention time). */
let recorded: { id: string; token: string } | null = null;
const rpcButtons = (["flush", "cancel", "pause", "resume"] as const).map((m) => [m, $<HTMLButtonElement>(m)] as const);

const stats = new StatsTracker();
window.__worldcast = stats.s;
let client: SessionClient | null = null;
let lastInputMs = -Infinity;
const input = new InputState(video, () => client !== null);

function say(text: string): void {
  status.textContent = text;
}

let model: ModelInfo | null = null;

function setConnected(on: boolean): void {
  stats.s.connected = on;
  connectBtn.textContent = on ? "Disconnect" : "Connect";
  transportSel.disabled = roomInput.disabled = imageInput.disabled = on;
  connectBtn.disabled = false;
  promptBtn.disabled = !on || model?.conditioning.text === null;
  shareBtn.disabled = !on;
  for (const [, b] of rpcButtons) b.disabled = !on;
}

// -- actions --------------------------------------------------------------------------------------

function sendAction(): void {
  if (!client) return;
  const keys = input.keys();
  const axes = input.axes();
  stats.sent(client.sendAction(keys, input.takeMouse(), axes), keys, axes);
}

input.onChange = () => {
  lastInputMs = performance.now();
  sendAction(); // every key down/up goes out at once
};
setInterval(() => {
  if (!client) return;
  const now = performance.now();
  if (input.busy) lastInputMs = now;
  if (now - lastInputMs <= REPEAT_AFTER_INPUT_MS) sendAction();
}, 1000 / ACTION_HZ);

// -- server events --------------------------------------------------------------------------------

function onEvent(ev: ServerEvent): void {
  switch (ev.event) {
    case "frame":
      stats.frame(ev);
      break;
    case "state":
      stats.s.state = ev.state;
      if (ev.state === "closed") disconnect("the server closed the session");
      else if (ev.state === "idle") say("idle (no input for a while): press a key or move the mouse to resume");
      break;
    case "error":
      stats.error(ev.message);
      say(`server error (${ev.code}): ${ev.message}`);
      break;
    case "action_rejected":
      stats.s.rejected += 1;
      stats.error(ev.message);
      say(`action ${ev.seq ?? "?"} rejected: ${ev.message}`);
      break;
  }
}

function countVideoFrames(): void {
  if (!("requestVideoFrameCallback" in video)) return;
  const tick = () => {
    stats.s.videoFrames += 1;
    video.requestVideoFrameCallback(tick);
  };
  video.requestVideoFrameCallback(tick);
}

// -- the model's declared inputs -----------------------------------------------------------------------

function keyCaps(key: string): string {
  return `<kbd>${key === "space" ? "Space" : key === "shift" ? "Shift" : key.toUpperCase()}</kbd>`;
}

/** Names of the standard mapping's inputs (https://w3c.github.io/gamepad/#remapping) for the help line. */
const PAD_NAMES: Record<string, string> = {
  "gamepad.axis.0": "left stick", "gamepad.axis.1": "left stick", "gamepad.axis.2": "right stick",
  "gamepad.axis.3": "right stick", "gamepad.button.0": "A", "gamepad.button.1": "B", "gamepad.button.2": "X",
  "gamepad.button.3": "Y", "gamepad.button.6": "left trigger", "gamepad.button.7": "right trigger",
  "gamepad.button.12": "d-pad", "gamepad.button.13": "d-pad", "gamepad.button.14": "d-pad", "gamepad.button.15": "d-pad",
};

/** "left stick: walk right (stick), walk down (stick); ..." from the model's gamepad bindings. */
function gamepadHelp(a: ModelInfo["actions"]): string {
  const labels = new Map<string, string>(a.axes.map((x) => [x.name, x.label]));
  const parts = new Map<string, string[]>();
  for (const [input, control] of Object.entries(a.bindings)) {
    if (!input.startsWith("gamepad.")) continue;
    const name = PAD_NAMES[input] ?? input.slice("gamepad.".length);
    const what = labels.get(control) ?? a.key_labels[control] ?? control;
    const list = parts.get(name) ?? [];
    if (!list.includes(what)) list.push(what);
    parts.set(name, list);
  }
  return [...parts].map(([n, w]) => `${n}: ${w.join(", ")}`).join("; ");
}

/** Build the page's inputs from the model's declared action space and conditioning (GET /v1/model). */
function applyModel(m: ModelInfo): void {
  model = m;
  const a = m.actions;
  input.allowed = new Set(a.keys);
  input.mouse = a.mouse.length > 0;
  input.gamepad.configure(a.axes ?? [], a.keys, a.bindings ?? {});
  const keys = a.keys.map((k) => `${keyCaps(k)} ${a.key_labels[k] ?? k}`).join(", ");
  const mouse = input.mouse
    ? `; click the video to steer with the mouse (${a.mouse.map((x) => x.name).join(", ")}; <kbd>Esc</kbd> releases it)`
    : "";
  const pad = input.gamepad.bound ? `; or plug in a gamepad (${gamepadHelp(a)})` : "";
  const text = m.conditioning.text !== null ? " A new prompt is applied with <em>Set prompt</em> (set_prompt, then flush)." : "";
  keysHelp.innerHTML = `${m.name}: ${keys}${mouse}${pad}.${text}`;
  const img = m.conditioning.image;
  imageInput.hidden = img === null;
  if (img !== null) {
    imageInput.title = img.required && img.default === null ? "the starting image (required)"
      : `the starting image (optional; without one: ${img.default ?? "the model's default"})`;
  }
  promptInput.hidden = promptBtn.hidden = m.conditioning.text === null;
  promptInput.placeholder = m.default_prompt ?? "";
}

function readImage(): Promise<string | undefined> {
  const file = imageInput.files?.[0];
  if (!file) return Promise.resolve(undefined);
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result)); // a data:image/...;base64, URL, as POST /v1/sessions takes it
    r.onerror = () => reject(new Error(`cannot read ${file.name}`));
    r.readAsDataURL(file);
  });
}

// -- connection -----------------------------------------------------------------------------------

async function connect(): Promise<void> {
  connectBtn.disabled = true;
  stats.reset();
  stats.s.state = "connecting";
  say("connecting…");
  let c: SessionClient;
  if (transportSel.value === "livekit") {
    const { LiveKitWorldClient } = await import("./livekit"); // livekit-client loads only for this mode
    c = new LiveKitWorldClient(roomInput.value.trim() || `worldcast-${Math.random().toString(36).slice(2, 10)}`);
  } else {
    c = new WorldcastClient();
  }
  c.onEvent = onEvent;
  c.onTrack = (stream) => {
    video.srcObject = stream;
    video.play().catch(() => {}); // autoplay of a muted video is allowed; this only nudges it
  };
  c.onClosed = (why) => {
    if (client === c) disconnect(why);
  };
  try {
    const start: StartRequest = {};
    if (recordBox.checked) start.record = true;
    const prompt = promptInput.value.trim();
    if (prompt && !promptInput.hidden) start.prompt = prompt;
    const image = await readImage();
    if (image) start.image = image;
    const session = await c.connect(start);
    client = c;
    sessionToken = session.token;
    if (start.record) showDownload(session.session_id);
    applyModel(session.model);
    stats.s.sessionId = session.session_id;
    if (stats.s.state === "connecting") stats.s.state = "active";
    setConnected(true);
    connectBtn.blur(); // so space steers instead of pressing the button
    const m = session.model;
    say(`session ${session.session_id} · ${m.name} ${m.frame_width}×${m.frame_height} @ ${m.fps} fps` +
      (input.mouse ? " · click the video to steer with the mouse (Esc releases it)" : ""));
  } catch (e) {
    c.close();
    stats.s.state = "disconnected";
    setConnected(false);
    say(`could not connect: ${(e as Error).message}`);
  }
}

function disconnect(why = "disconnected"): void {
  const c = client;
  client = null;
  input.releaseAll();
  c?.close();
  if (document.pointerLockElement === video) document.exitPointerLock();
  video.srcObject = null;
  stats.s.state = "disconnected";
  setConnected(false);
  say(why);
}

// -- RPCs -----------------------------------------------------------------------------------------

async function rpc(method: "flush" | "cancel" | "pause" | "resume"): Promise<void> {
  if (!client) return;
  try {
    const result = await client.rpc(method);
    say("epoch" in result ? `${method}: epoch ${String(result.epoch)}` : `${method}: ok`);
  } catch (e) {
    say((e as Error).message);
  }
}

/** set_prompt, then flush so the chunk in flight restarts under the new prompt. */
async function setPrompt(): Promise<void> {
  const text = promptInput.value.trim();
  if (!client || !text) return;
  try {
    await client.rpc("set_prompt", { prompt: text });
    const { epoch } = await client.rpc("flush");
    say(`prompt set (${text.length} characters), epoch ${String(epoch)}`);
  } catch (e) {
    say((e as Error).message);
  }
}

// -- recording --------------------------------------------------------------------------------------

let sessionToken = "";

function showDownload(sessionId: string): void {
  recorded = { id: sessionId, token: sessionToken };
  downloadLink.hidden = false;
  filmLink.hidden = false;
}

/** Record from now (record_start: a log that is not replayable) or stop, while connected. */
recordBox.onchange = () => {
  if (!client) return;
  const on = recordBox.checked;
  client.rpc(on ? "record_start" : "record_stop").then(() => {
    if (on && stats.s.sessionId) showDownload(stats.s.sessionId);
    say(on ? "recording (from now: not replayable; record from Connect for that)" : "recording stopped");
  }).catch((e: unknown) => {
    recordBox.checked = !on;
    say((e as Error).message);
  });
};

for (const [link, part] of [[downloadLink, "events"], [filmLink, "film"]] as const) {
  link.onclick = (ev) => {
    ev.preventDefault();
    if (recorded) downloadRecording(recorded.id, recorded.token, part).catch((e: unknown) => say((e as Error).message));
  };
}

// -- sharing --------------------------------------------------------------------------------------------

/** Mint a viewer token (POST /v1/sessions/{id}/viewers) and show the watch page's link: the WHEP URL and the
 * token ride in its fragment, which no server logs (docs/sharing.md). */
shareBtn.onclick = () => {
  const id = stats.s.sessionId;
  if (!client || !id) return;
  fetch(`/v1/sessions/${id}/viewers`, { method: "POST", headers: { Authorization: `Bearer ${sessionToken}` } })
    .then(async (r) => {
      if (!r.ok) throw new Error(`share: ${r.status} ${await r.text()}`);
      const v = (await r.json()) as { viewer_token: string; whep_url: string; expires_in_s: number };
      const url = new URL("./watch.html", location.href);
      url.hash = new URLSearchParams({ whep: v.whep_url, token: v.viewer_token }).toString();
      watchLink.href = url.toString();
      watchLink.hidden = false;
      say(`share this link to let others watch (view only, for ${Math.round(v.expires_in_s / 60)} min)`);
      navigator.clipboard?.writeText(url.toString()).catch(() => {});
    })
    .catch((e: unknown) => say((e as Error).message));
};

connectBtn.onclick = () => void (client ? disconnect() : connect());
// ?transport=livekit&room=NAME preselects the LiveKit mode
const query = new URLSearchParams(location.search);
if (query.get("transport") === "livekit") transportSel.value = "livekit";
roomInput.value = query.get("room") ?? "";
const showRoom = () => (roomInput.hidden = transportSel.value !== "livekit");
transportSel.onchange = showRoom;
showRoom();
promptBtn.onclick = () => void setPrompt();
promptInput.addEventListener("keydown", (e) => {
  if (e.key === "Enter") void (client ? setPrompt() : connect());
});
for (const [m, b] of rpcButtons) b.onclick = () => void rpc(m);
window.addEventListener("pagehide", () => client?.close());
video.muted = true;
setConnected(false);
fetch("/v1/model").then(async (r) => {
  if (r.ok) applyModel((await r.json()) as ModelInfo);
}).catch(() => {}); // the page still connects; the first session's reply carries the model too
countVideoFrames();
setInterval(() => stats.render(overlay), OVERLAY_MS);
stats.render(overlay);
