// A worldcast session over WebRTC: create the session, negotiate, carry actions and RPCs.

import type {
  ActionMessage,
  CreateSessionResponse,
  RpcMethod,
  RpcReply,
  ServerEvent,
} from "./protocol";

/** Longest wait for ICE gathering before the offer is sent anyway, ms. */
const ICE_GATHER_TIMEOUT_MS = 2000;
/** Longest wait for an RPC reply, ms. */
const RPC_TIMEOUT_MS = 10000;

export class WorldcastClient {
  readonly pc: RTCPeerConnection;
  readonly actions: RTCDataChannel;
  readonly control: RTCDataChannel;
  session: CreateSessionResponse | null = null;
  onEvent: (ev: ServerEvent) => void = () => {};
  onTrack: (stream: MediaStream) => void = () => {};
  private seq = -1;
  private rpcId = 0;
  private pending = new Map<number, (r: RpcReply) => void>();

  constructor(private readonly baseUrl = "") {
    this.pc = new RTCPeerConnection({ iceServers: [] });
    this.actions = this.pc.createDataChannel("actions", { ordered: false, maxRetransmits: 0 });
    this.control = this.pc.createDataChannel("control");
    this.pc.addTransceiver("video", { direction: "recvonly" });
    this.pc.ontrack = (e) => this.onTrack(e.streams[0] ?? new MediaStream([e.track]));
    this.control.onmessage = (e) => this.handleControl(String(e.data));
  }

  private headers(): Record<string, string> {
    const h: Record<string, string> = { "Content-Type": "application/json" };
    if (this.session) h["Authorization"] = `Bearer ${this.session.token}`;
    return h;
  }

  /** Create a session and connect to it; resolves when both data channels are open. */
  async connect(prompt?: string): Promise<CreateSessionResponse> {
    const body = prompt ? { prompt } : {};
    const r = await fetch(`${this.baseUrl}/v1/sessions`, {
      method: "POST",
      headers: this.headers(),
      body: JSON.stringify(body),
    });
    if (!r.ok) throw new Error(`create session: ${r.status} ${await r.text()}`);
    this.session = (await r.json()) as CreateSessionResponse;

    await this.pc.setLocalDescription(await this.pc.createOffer());
    await this.iceGatheringComplete();
    const a = await fetch(`${this.baseUrl}/v1/sessions/${this.session.session_id}/webrtc`, {
      method: "POST",
      headers: this.headers(),
      body: JSON.stringify({ sdp: this.pc.localDescription!.sdp, type: "offer" }),
    });
    if (!a.ok) throw new Error(`signaling: ${a.status} ${await a.text()}`);
    await this.pc.setRemoteDescription((await a.json()) as RTCSessionDescriptionInit);
    await Promise.all([opened(this.actions), opened(this.control)]);
    return this.session;
  }

  private iceGatheringComplete(): Promise<void> {
    if (this.pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        this.pc.removeEventListener("icegatheringstatechange", check);
        resolve();
      };
      const check = () => {
        if (this.pc.iceGatheringState === "complete") done();
      };
      this.pc.addEventListener("icegatheringstatechange", check);
      setTimeout(done, ICE_GATHER_TIMEOUT_MS);
    });
  }

  private handleControl(data: string): void {
    const msg = JSON.parse(data) as ServerEvent | RpcReply;
    if ("event" in msg) {
      this.onEvent(msg);
      return;
    }
    const resolve = typeof msg.id === "number" ? this.pending.get(msg.id) : undefined;
    if (resolve) {
      this.pending.delete(msg.id as number);
      resolve(msg);
    }
  }

  /** Send the held keys and the mouse movement since the last message; returns the seq. */
  sendAction(keys: string[], mouse: [number, number]): number {
    if (this.actions.readyState !== "open") return this.seq;
    this.seq += 1;
    const msg: ActionMessage = { seq: this.seq, t: performance.now(), keys, mouse };
    this.actions.send(JSON.stringify(msg));
    return this.seq;
  }

  get lastSentSeq(): number {
    return this.seq;
  }

  /** Call a control RPC; rejects with the server's error message. */
  rpc(method: RpcMethod, params: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    const id = ++this.rpcId;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method}: no reply`));
      }, RPC_TIMEOUT_MS);
      this.pending.set(id, (reply) => {
        clearTimeout(timer);
        if (reply.error) reject(new Error(`${method}: ${reply.error.message} (${reply.error.code})`));
        else resolve(reply.result ?? {});
      });
      this.control.send(JSON.stringify({ id, method, params }));
    });
  }

  /** Close the connection and delete the session (keepalive, so it also works on unload). */
  close(): void {
    if (this.session) {
      fetch(`${this.baseUrl}/v1/sessions/${this.session.session_id}`, {
        method: "DELETE",
        headers: this.headers(),
        keepalive: true,
      }).catch(() => {});
    }
    this.pc.close();
  }
}

function opened(ch: RTCDataChannel): Promise<void> {
  if (ch.readyState === "open") return Promise.resolve();
  return new Promise((resolve, reject) => {
    ch.addEventListener("open", () => resolve(), { once: true });
    ch.addEventListener("close", () => reject(new Error(`data channel ${ch.label} closed`)), { once: true });
  });
}
