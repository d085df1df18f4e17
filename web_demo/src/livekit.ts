// A worldcast session over LiveKit (livekit-client): the server joins a room as the session's
// world; the page joins it as the session's user with the token from the create reply.
//
// Same surface as WorldcastClient (client.ts), so the page drives either:
// - video: the world's track;
// - actions: data packets on topic `actions` to the world (lossy, like the WebRTC `actions` channel);
// - RPCs: LiveKit RPC methods on the world (flush, cancel, set_prompt, pause, resume, get_state),
//   payload the JSON params, response the JSON result;
// - server events: data topics `frames` (frame metadata) and `events` (state, error, action_rejected).

import {
  type Participant,
  type RemoteParticipant,
  type RemoteTrack,
  Room,
  RoomEvent,
  RpcError,
  Track,
} from "livekit-client";

import type {
  ActionMessage, CreateSessionRequest, CreateSessionResponse, RpcMethod, ServerEvent, StartRequest,
} from "./protocol";

/** Longest wait for the world's video track after joining, ms. */
const TRACK_TIMEOUT_MS = 15000;
/** Response timeout of an RPC, ms (livekit-client clamps anything under 8 s up to 8 s). */
const RPC_TIMEOUT_MS = 10000;
/** Attribute set on joining: any attribute change makes LiveKit announce us to the world at once
 * (otherwise a participant that publishes no media is announced within 3 s). */
const USER_ATTRIBUTE = "worldcast.role";

/** What the page needs of a session client (WorldcastClient has the same shape). */
export interface SessionClient {
  onEvent: (ev: ServerEvent) => void;
  onTrack: (stream: MediaStream) => void;
  onClosed: (why: string) => void;
  connect(start?: StartRequest): Promise<CreateSessionResponse>;
  sendAction(keys: string[], mouse: [number, number], axes?: Record<string, number>): number;
  readonly lastSentSeq: number;
  rpc(method: RpcMethod, params?: Record<string, unknown>): Promise<Record<string, unknown>>;
  close(): void;
}

export class LiveKitWorldClient implements SessionClient {
  readonly room = new Room({ adaptiveStream: false, dynacast: false });
  session: CreateSessionResponse | null = null;
  onEvent: (ev: ServerEvent) => void = () => {};
  onTrack: (stream: MediaStream) => void = () => {};
  onClosed: (why: string) => void = () => {};
  private seq = -1;
  private closed = false;
  private world = "";
  private readonly encoder = new TextEncoder();
  private readonly decoder = new TextDecoder();

  constructor(private readonly roomName: string, private readonly baseUrl = "") {}

  /** Create the session (the server's world joins `roomName`), then join it; resolves once the video arrives. */
  async connect(start: StartRequest = {}): Promise<CreateSessionResponse> {
    const req: CreateSessionRequest & { transport: "livekit"; room: string } = {
      transport: "livekit", room: this.roomName, ...start,
    };
    const r = await fetch(`${this.baseUrl}/v1/sessions`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(req),
    });
    if (!r.ok) throw new Error(`create session: ${r.status} ${await detail(r)}`);
    this.session = (await r.json()) as CreateSessionResponse;
    const lk = this.session.livekit;
    if (!lk) throw new Error("create session: the reply has no LiveKit access (server too old?)");
    this.world = lk.world_identity;

    const gotTrack = new Promise<void>((resolve) => {
      this.room.on(RoomEvent.TrackSubscribed, (track: RemoteTrack, _pub, p: RemoteParticipant) => {
        if (track.kind === Track.Kind.Video && p.identity === this.world) {
          this.onTrack(new MediaStream([track.mediaStreamTrack]));
          resolve();
        }
      });
    });
    this.room.on(RoomEvent.DataReceived, (payload: Uint8Array, p?: Participant, _kind?: unknown, topic?: string) => {
      if (p && p.identity !== this.world) return;
      if (topic !== "frames" && topic !== "events") return;
      try {
        this.onEvent(JSON.parse(this.decoder.decode(payload)) as ServerEvent);
      } catch {
        console.warn("worldcast: data packet is not JSON", topic);
      }
    });
    this.room.on(RoomEvent.ParticipantDisconnected, (p: RemoteParticipant) => {
      if (p.identity === this.world) this.lost("the world left the room");
    });
    this.room.on(RoomEvent.Disconnected, () => this.lost("disconnected from the LiveKit room"));

    await this.room.connect(lk.url, lk.token, { autoSubscribe: true });
    await this.room.localParticipant.setAttributes({ [USER_ATTRIBUTE]: "user" });
    await withTimeout(gotTrack, TRACK_TIMEOUT_MS, "the world's video track did not arrive");
    return this.session;
  }

  /** Send the held keys, the mouse movement since the last message and the axes (left out when empty); returns
   * its seq (-1: not joined). */
  sendAction(keys: string[], mouse: [number, number], axes: Record<string, number> = {}): number {
    if (this.closed || !this.world || this.room.state !== "connected") return -1;
    this.seq += 1;
    const msg: ActionMessage = { seq: this.seq, t: performance.now(), keys, mouse };
    if (Object.keys(axes).length > 0) msg.axes = axes;
    this.room.localParticipant
      .publishData(this.encoder.encode(JSON.stringify(msg)), {
        reliable: false, topic: "actions", destinationIdentities: [this.world],
      })
      .catch((e: unknown) => console.warn("worldcast: action not sent", e));
    return this.seq;
  }

  get lastSentSeq(): number {
    return this.seq;
  }

  /** Call a control RPC on the world; resolves with its result, rejects with its error. */
  async rpc(method: RpcMethod, params: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    if (this.closed || !this.world) throw new Error(`${method}: not connected`);
    try {
      const out = await this.room.localParticipant.performRpc({
        destinationIdentity: this.world, method, payload: JSON.stringify(params), responseTimeout: RPC_TIMEOUT_MS,
      });
      return out ? (JSON.parse(out) as Record<string, unknown>) : {};
    } catch (e) {
      if (e instanceof RpcError) throw new Error(`${method}: ${e.message} (${e.code})`);
      throw e;
    }
  }

  private lost(why: string): void {
    if (this.closed) return;
    this.closed = true;
    this.onClosed(why);
  }

  /** Leave the room (the server closes the session) and delete the session. */
  close(): void {
    this.closed = true;
    if (this.session) {
      fetch(`${this.baseUrl}/v1/sessions/${this.session.session_id}`, {
        method: "DELETE", headers: { Authorization: `Bearer ${this.session.token}` }, keepalive: true,
      }).catch(() => {});
      this.session = null;
    }
    void this.room.disconnect();
  }
}

async function detail(r: Response): Promise<string> {
  try {
    const body = (await r.json()) as { detail?: unknown };
    return body.detail !== undefined ? String(body.detail) : r.statusText;
  } catch {
    return r.statusText;
  }
}

function withTimeout<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(message)), ms);
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}
