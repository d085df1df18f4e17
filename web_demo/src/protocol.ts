// Wire messages, field names exactly as the server's transport/schemas.py and transport/rpc.py.

export interface ModelInfo {
  name: string;
  frame_width: number;
  frame_height: number;
  fps: number;
  frames_per_chunk: number;
  denoising_steps: number;
  keys: string[];
  default_prompt: string;
}

export interface CreateSessionResponse {
  session_id: string;
  token: string;
  model: ModelInfo;
}

/** One message on the `actions` data channel. */
export interface ActionMessage {
  seq: number; // increasing per message
  t: number; // client send time, ms
  keys: string[]; // keys held now
  mouse: [number, number]; // movement since the previous message, counts
}

export type RpcMethod = "flush" | "cancel" | "set_prompt" | "pause" | "resume" | "get_state";

export interface RpcRequest {
  id: number;
  method: RpcMethod;
  params: Record<string, unknown>;
}

export interface RpcError {
  code: number;
  message: string;
}

export interface RpcReply {
  id: number | string | null;
  result?: Record<string, unknown>;
  error?: RpcError;
}

export interface FrameEvent {
  event: "frame";
  frame_index: number;
  pts: number;
  action_seq: number;
  epoch: number;
  timings_ms: { queue: number; denoise: number; commit: number };
}

export interface StateEvent {
  event: "state";
  state: "created" | "active" | "idle" | "closed";
}

export interface ErrorEvent {
  event: "error";
  code: string;
  message: string;
}

export interface ActionRejectedEvent {
  event: "action_rejected";
  seq: number | null;
  code: number;
  message: string;
}

export type ServerEvent = FrameEvent | StateEvent | ErrorEvent | ActionRejectedEvent;
