// A worldcast session over WebRTC: create the session, negotiate, carry actions and RPCs.
//
// Signaling is one round trip without trickle ICE: the data channels and a recvonly video
// transceiver exist before the offer, and the offer is sent once ICE gathering completes.

import type {
  ActionMessage,
  CreateSessionRequest,
  CreateSessionResponse,
  StartRequest,
  RpcMethod,
  RpcReply,
  SdpAnswer,
  SdpOffer,
  ServerEvent,
} from "./protocol";

/** Longest wait for ICE gathering before the offer goes out with the candidates so far, ms. */
const ICE_GATHER_TIMEOUT_MS = 2000;
/** Longest wait for the data channels to open after the answer, ms. */
const CHANNEL_OPEN_TIMEOUT_MS = 15000;
/** Longest wait for an RPC reply, ms. */
const RPC_TIMEOUT_MS = 10000;

export class WorldcastClient {
  readonly pc: RTCPeerConnection;
  /** Unordered, no retransmits: a late action is worthless, the next one carries the held keys. */
  readonly actions: RTCDataChannel;
  /** Reliable and ordered: RPCs, their replies and server events. */
  readonly control: RTCDataChannel;
  session: CreateSessionResponse | null = null;
  onEvent: (ev: ServerEvent) => void = () => {};
  onTrack: (stream: MediaStream) => void = () => {};
  /** Called once when the connection fails or closes (not after `close()`). */
  onClosed: (why: string) => void = () => {};
  private seq = -1;
  private rpcId = 0;
  private pending = new Map<number, (r: RpcReply) => void>();
  private closed = false;

  constructor(private readonly baseUrl = "") {
    this.pc = new RTCPeerConnection({ iceServers: [] });
    this.actions = this.pc.createDataChannel("actions", { ordered: false, maxRetransmits: 0 });
    this.control = this.pc.createDataChannel("control");
    this.pc.addTransceiver("video", { direction: "recvonly" });
    this.pc.ontrack = (e) => this.onTrack(e.streams[0] ?? new MediaStream([e.track]));
    this.control.onmessage = (e) => this.handleControl(String(e.data));
    this.pc.onconnectionstatechange = () => {
      const s = this.pc.connectionState;
      if (s === "failed" || s === "closed") this.lost(`peer connection ${s}`);
    };
    this.control.onclose = () => this.lost("control channel closed");
  }

  private headers(): Record<string, string> {
    const h: Record<string, string> = { "Content-Type": "application/json" };
    if (this.session) h["Authorization"] = `Bearer ${this.session.token}`;
    return h;
  }

  private async post<T>(path: string, body: unknown, what: string): Promise<T> {
    const r = await fetch(`${this.baseUrl}${path}`, {
      method: "POST",
      headers: this.headers(),
      body: JSON.stringify(body),
    });
    if (!r.ok) throw new Error(`${what}: ${await httpError(r)}`);
    return (await r.json()) as T;
  }

  /** Create a session and connect to it; resolves when both data channels are open. */
  async connect(start: StartRequest = {}): Promise<CreateSessionResponse> {
    const req: CreateSessionRequest = { ...start };
    this.session = await this.post<CreateSessionResponse>("/v1/sessions", req, "create session");

    await this.pc.setLocalDescription(await this.pc.createOffer());
    await this.iceGatheringComplete();
    const offer: SdpOffer = { sdp: this.pc.localDescription!.sdp, type: "offer" };
    const answer = await this.post<SdpAnswer>(
      `/v1/sessions/${this.session.session_id}/webrtc`, offer, "signaling");
    await this.pc.setRemoteDescription(answer);
    await withTimeout(Promise.all([opened(this.actions), opened(this.control)]), CHANNEL_OPEN_TIMEOUT_MS,
      "data channels did not open (ICE failed?)");
    return this.session;
  }

  private iceGatheringComplete(): Promise<void> {
    if (this.pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.pc.removeEventListener("icegatheringstatechange", check);
        resolve();
      };
      const check = () => {
        if (this.pc.iceGatheringState === "complete") done();
      };
      const timer = setTimeout(done, ICE_GATHER_TIMEOUT_MS);
      this.pc.addEventListener("icegatheringstatechange", check);
    });
  }

  private handleControl(data: string): void {
    let msg: ServerEvent | RpcReply;
    try {
      msg = JSON.parse(data) as ServerEvent | RpcReply;
    } catch {
      console.warn("worldcast: control message is not JSON", data);
      return;
    }
    if ("event" in msg) {
      this.onEvent(msg);
      return;
    }
    const resolve = typeof msg.id === "number" ? this.pending.get(msg.id) : undefined;
    if (resolve) {
      this.pending.delete(msg.id as number);
      resolve(msg);
    } else if (msg.error) {
      console.warn("worldcast: unmatched RPC error", msg.error);
    }
  }

  /** Send the held keys, the mouse movement since the last message and the axes (left out when empty); returns
   * its seq (-1: not open). */
  sendAction(keys: string[], mouse: [number, number], axes: Record<string, number> = {}): number {
    if (this.actions.readyState !== "open") return -1;
    this.seq += 1;
    const msg: ActionMessage = { seq: this.seq, t: performance.now(), keys, mouse };
    if (Object.keys(axes).length > 0) msg.axes = axes;
    this.actions.send(JSON.stringify(msg));
    return this.seq;
  }

  get lastSentSeq(): number {
    return this.seq;
  }

  /** Call a control RPC; resolves with its result, rejects with the server's error. */
  rpc(method: RpcMethod, params: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    if (this.control.readyState !== "open") return Promise.reject(new Error(`${method}: not connected`));
    const id = ++this.rpcId;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method}: no reply within ${RPC_TIMEOUT_MS / 1000} s`));
      }, RPC_TIMEOUT_MS);
      this.pending.set(id, (reply) => {
        clearTimeout(timer);
        if (reply.error) reject(new Error(`${method}: ${reply.error.message} (${reply.error.code})`));
        else resolve(reply.result ?? {});
      });
      this.control.send(JSON.stringify({ id, method, params }));
    });
  }

  private lost(why: string): void {
    if (this.closed) return;
    this.closed = true;
    this.failPending(why);
    this.onClosed(why);
  }

  private failPending(why: string): void {
    for (const resolve of this.pending.values()) resolve({ id: null, error: { code: -32000, message: why } });
    this.pending.clear();
  }

  /** Close the connection and delete the session (keepalive, so it also works on page unload). */
  close(): void {
    this.closed = true;
    this.failPending("disconnected");
    if (this.session) {
      fetch(`${this.baseUrl}/v1/sessions/${this.session.session_id}`, {
        method: "DELETE",
        headers: this.headers(),
        keepalive: true,
      }).catch(() => {});
      this.session = null;
    }
    this.pc.close();
  }
}

/** "503 server at capacity (retry after 2 s)" from an error response. */
async function httpError(r: Response): Promise<string> {
  let detail = r.statusText;
  try {
    const body = (await r.json()) as { detail?: unknown };
    if (body.detail !== undefined) detail = String(body.detail);
  } catch {
    // not JSON: keep the status text
  }
  const retry = r.headers.get("Retry-After");
  return `${r.status} ${detail}${retry ? ` (retry after ${retry} s)` : ""}`;
}

function opened(ch: RTCDataChannel): Promise<void> {
  if (ch.readyState === "open") return Promise.resolve();
  return new Promise((resolve, reject) => {
    ch.addEventListener("open", () => resolve(), { once: true });
    ch.addEventListener("close", () => reject(new Error(`data channel ${ch.label} closed`)), { once: true });
  });
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
