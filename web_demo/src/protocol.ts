// Wire messages. Field names are exactly those of the server's transport/schemas.py,
// transport/rpc.py and transport/webrtc/peer.py; change them there first.

/** One mouse axis of a model's action space (schemas.MouseAxisInfo). */
export interface MouseAxisInfo {
  name: string; // e.g. "yaw"
  scale: number; // model units per mouse count
  limit: number | null;
}

/** One continuous control of a model's action space (schemas.AxisInfo). */
export interface AxisInfo {
  name: string;
  label: string;
  kind: "relative" | "absolute"; // relative: movement since the previous message; absolute: the position now
  range: [number, number]; // values a message may carry, inclusive
  rest: number; // absolute: the position when none is given
  scale: number;
  limit: number | null;
}

/** The actions a model understands (schemas.ActionSpaceInfo): the demo builds its inputs from this. */
export interface ActionSpaceInfo {
  keys: string[]; // key names an action may hold
  key_labels: Record<string, string>; // what each key does
  mouse: MouseAxisInfo[]; // axes fed by an action's mouse [dx, dy]; empty: the mouse is ignored
  axes: AxisInfo[]; // continuous controls an action's `axes` may set
  bindings: Record<string, string>; // "mouse.x" | "gamepad.axis.N" | "gamepad.button.N" -> key or axis name
  exclusive_groups: string[][];
  dim: number;
  history_pixel_frames: number;
}

/** What a model is conditioned on (schemas.ConditioningInfo); null: not taken. */
export interface ConditioningInfo {
  text: { max_chars: number; required: boolean } | null;
  image: { required: boolean; default: string | null; max_bytes: number; max_pixels: number;
           formats: string[] } | null;
}

/** The served model's declared geometry (GET /v1/model, and part of a new session). */
export interface ModelInfo {
  name: string;
  frame_width: number; // px
  frame_height: number; // px
  fps: number;
  frames_per_chunk: number;
  denoising_steps: number;
  keys: string[]; // = actions.keys
  default_prompt: string | null; // null: the model takes no text
  actions: ActionSpaceInfo;
  conditioning: ConditioningInfo;
}

/** What a session starts from: a prompt and/or a starting image (base64 data URL). */
export interface StartRequest {
  record?: boolean; // record from the first frame (docs/recordings.md)
  prompt?: string;
  image?: string; // data:image/png;base64,... (models whose conditioning takes an image)
}

/** Body of POST /v1/sessions (all optional). */
export interface CreateSessionRequest {
  prompt?: string; // 1..500 characters
  image?: string; // a PNG or JPEG as base64 or a data:image/...;base64, URL
  seed?: number; // 0..2^31-1
  transport?: "webrtc" | "livekit"; // livekit: the server joins `room` as the session's world
  room?: string; // LiveKit room (transport livekit only)
  record?: boolean; // record from the first frame: GET /v1/sessions/{id}/recording/events
}

/** How the user joins a LiveKit session (schemas.LiveKitAccess). */
export interface LiveKitAccess {
  url: string; // LiveKit server, ws:// or wss://
  room: string;
  identity: string; // the user's participant identity
  token: string; // access token: join this room, subscribe, publish data only
  token_ttl_s: number;
  world_identity: string; // the world participant: its track, RPC methods and data topics
}

/** 201 reply of POST /v1/sessions. */
export interface CreateSessionResponse {
  session_id: string;
  token: string; // send as "Authorization: Bearer <token>" on this session's routes
  model: ModelInfo;
  livekit?: LiveKitAccess | null; // transport "livekit" only
}

/** Body of POST /v1/sessions/{id}/webrtc, and its reply. */
export interface SdpOffer {
  sdp: string;
  type: "offer";
}

export interface SdpAnswer {
  sdp: string;
  type: "answer";
}

/** One message on the `actions` data channel. */
export interface ActionMessage {
  seq: number; // increasing per message, from 0
  t: number; // client send time, ms (performance.now())
  keys: string[]; // keys held now (names from ModelInfo.keys)
  mouse: [number, number]; // movement since the previous message (dx, dy), counts
  axes?: Record<string, number>; // the model's axes by name: movement (relative) or position now (absolute)
}

// -- control channel: RPCs ----------------------------------------------------------------------

export type RpcMethod = "flush" | "cancel" | "set_prompt" | "pause" | "resume" | "get_state" | "record_start" |
  "record_stop";

export interface RpcRequest {
  id: number;
  method: RpcMethod;
  params: Record<string, unknown>; // set_prompt: {prompt}; the others: {}
}

/** JSON-RPC 2.0 style codes (transport/errors.py): -32700 parse, -32600 request, -32601 method,
 * -32602 params, -32603 internal, -32000 session closed, -32001 rate limited. */
export interface RpcError {
  code: number;
  message: string;
}

export interface RpcReply {
  id: number | string | null;
  result?: Record<string, unknown>;
  error?: RpcError;
}

/** Result of get_state (Session.info()). */
export interface SessionInfo {
  session_id: string;
  state: SessionStateName;
  prompt: string;
  paused: boolean;
  cancelled: boolean;
  epoch: number;
  frames_generated: number;
  frames_delivered: number;
  frames_dropped_stale: number;
  last_action_seq: number;
  sinks: number;
  duty_cycle: number;
}

// -- control channel: server events -------------------------------------------------------------

export type SessionStateName = "created" | "active" | "idle" | "closed";

/** Sent once per delivered frame, alongside the video track. */
export interface FrameEvent {
  event: "frame";
  frame_index: number;
  pts: number; // 90 kHz RTP clock
  action_seq: number; // seq of the last action applied in this frame (-1: none yet)
  epoch: number; // flush epoch the frame was generated under
  timings_ms: { queue: number; denoise: number; decode: number }; // server stage times of its chunk, up to publication
}

export interface StateEvent {
  event: "state";
  state: SessionStateName;
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
