// The watch page: plays a session's WHEP URL with a viewer token, both from the link's fragment
// (#whep=URL&token=TOKEN: a fragment never reaches a server's logs), with a WHEP player that is not ours.

import { WebRTCPlayer } from "@eyevinn/webrtc-player";

declare global {
  interface Window {
    __watch: { state: string; errors: string[] };
  }
}

const video = document.getElementById("video") as HTMLVideoElement;
const status = document.getElementById("status") as HTMLElement;
window.__watch = { state: "connecting", errors: [] };

function say(text: string): void {
  status.textContent = text;
}

async function watch(): Promise<void> {
  const args = new URLSearchParams(location.hash.slice(1));
  const whep = args.get("whep");
  const token = args.get("token");
  if (!whep || !token) {
    window.__watch.state = "no-link";
    say("This page needs a share link (#whep=...&token=...): press Share on the demo page.");
    return;
  }
  const player = new WebRTCPlayer({ video, type: "whep", iceServers: [] });
  // an EventEmitter (Node's `events`, bundled); its typings need Node's, which this page does not load
  const events = player as unknown as { on(event: string, listener: () => void): void };
  events.on("no-media", () => window.__watch.errors.push("no-media"));
  events.on("peer-connection-failed", () => {
    window.__watch.errors.push("peer-connection-failed");
    window.__watch.state = "failed";
    say("The stream could not be played (the link expired or was revoked, or the session ended).");
  });
  try {
    await player.load(new URL(whep, location.href), `Bearer ${token}`);
    window.__watch.state = "playing";
    say("Watching.");
  } catch (e) {
    window.__watch.state = "failed";
    window.__watch.errors.push(String(e));
    say(`The stream could not be played: ${String(e)}`);
  }
}

void watch();
