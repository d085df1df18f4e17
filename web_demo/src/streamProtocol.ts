// Messages of the WebSocket stream (GET /v1/sessions/{id}/stream). Field names are exactly those of
// transport/stream/connection.py and transport/schemas.py (DirectionMessage); docs/streaming.md describes them.

/** Client -> server: a text direction (directing sessions). duration_s absent: 5 s; null: until the next. */
export interface DirectionMessage {
  type: "direction";
  id: string;
  prompt: string; // 1..500 characters
  duration_s?: number | null; // (0, 600] s
  from_segment?: number; // take that segment again: the world goes back to where it began (a new segment)
}

/** Client -> server: the token, as the first message (browsers cannot set WebSocket headers). */
export interface AuthMessage {
  type: "auth";
  token: string;
}

export interface StreamStartEvent {
  event: "stream_start";
  protocol: number;
  session_id: string;
  mode: "interactive" | "directing";
  fps: number;
  frames_per_chunk: number;
  model: string;
  prompt: string;
}

/** Precedes the init segment (the next binary message). */
export interface MediaInitEvent {
  event: "media_init";
  mime: string; // e.g. video/mp4; codecs="avc1.42C00C", read from the stream's SPS
  codec: string;
  width: number;
  height: number;
  timescale: number; // units per second
  frame_duration: number; // timescale units
  bytes: number;
}

/** Precedes each media segment (the next binary message). */
export interface MediaEvent {
  event: "media";
  frame_index: number;
  pts: number; // session PTS, 90 kHz
  action_seq: number;
  epoch: number;
  segment: number | null;
  keyframe: boolean;
  decode_time: number; // timescale units in the fMP4 timeline
  bytes: number;
  lateness_ms: number;
  encode_ms: number;
}

export interface SegmentSummary {
  segment: number;
  direction_id: string;
  epoch: number;
  frames: number;
  target_frames: number | null;
  first_frame_index: number | null;
  last_frame_index: number | null;
  end: "finished" | "cut" | "stopped" | null;
  retake_of: number | null; // the segment this one took again
  timings_ms: { ttff: number | null; wall: number | null; media: number };
}

export interface DirectionAckEvent {
  event: "direction_ack";
  id: string;
  segment: number;
  retake_of: number | null; // the segment taken again (from_segment), its take and later segments abandoned
  cut: SegmentSummary | null;
}

export interface SegmentStartEvent {
  event: "segment_start";
  segment: number;
  direction_id: string;
  prompt: string;
  epoch: number;
  target_frames: number | null;
  retake_of: number | null;
}

export interface SegmentCompleteEvent extends SegmentSummary {
  event: "segment_complete";
}

export interface StreamErrorEvent {
  event: "error";
  code: string;
  message: string;
  id?: string | number | null;
}

export interface StateEventMsg {
  event: "state";
  state: string;
}

export type StreamEvent =
  | StreamStartEvent
  | MediaInitEvent
  | MediaEvent
  | DirectionAckEvent
  | SegmentStartEvent
  | SegmentCompleteEvent
  | StreamErrorEvent
  | StateEventMsg
  | { event: "pong" | "action_rejected" };
