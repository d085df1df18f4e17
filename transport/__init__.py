"""The network edge: one connection core, a package per protocol, the HTTP edge, the CLI, the clients.

At the top, what every protocol shares, and the process:
- `connection.py`: the core every client connection composes (input guard, feedback, action and RPC
  dispatch, the frame event, one close that cancels every task and then awaits them), with `rpc.py`
  (control RPCs and actions: parse, validate, apply), `limits.py` (`InputGuard`: sizes, rates, the flood
  verdict), `feedback.py` (what a connection sends back for its input), `schemas.py` (the wire schemas)
  and `errors.py` (the server side's errors; error -> HTTP status and RPC code).
- `cli.py` (the `worldcast` command), `config.py` (`ServerConfig`), `memory.py` (memory after peaks).

The protocol adapters, each a translation over the core:
- `webrtc/`: aiortc peers (data channels and the video track), their registry, offer validation, ICE.
- `livekit/`: a session's world as a LiveKit room participant, and the agent worker.
- `stream/`: the fMP4 WebSocket both WebSocket protocols share (`socket.py`: fMP4 out, text in, the control
  loop), and the worldcast stream on it (`connection.py`).
- `dreamverse/`: Dreamverse's `/ws` over the same socket (the adapter reads the client in `connection.py`;
  what the client reads back is `events.py`), and its client's HTTP reads.

Beside them:
- `media/`: a frame's way out, shared by every sink (the drop-oldest queue, the picture, the stamp, H.264).
- `http/`: the FastAPI app (`app.py`: lifespan and wiring), its routers by surface (`routes/`), request
  bodies and connection limits, the model and engine APIs, metrics.
- `clients/`: the Python clients (WebRTC, stream, LiveKit user) and `worldcast direct`.

Dependencies point down: transport imports sessions, engine and models, never the reverse.
"""
