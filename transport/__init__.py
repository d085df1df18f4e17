"""The network edge: one connection core, thin protocol adapters, the HTTP API, the CLI, the clients.

- `connection.py`: the core every client connection composes (input guard, feedback, action and RPC
  dispatch, the frame event, one close that cancels every task and then awaits them).
- Adapters, each a protocol translation over the core: `webrtc.py` (aiortc data channels and track),
  `livekit/world.py` (a LiveKit room participant), `ws_stream.py` (the worldcast stream) and
  `dreamverse.py` (Dreamverse's `/ws`; what its client reads back in `dreamverse_events.py`); the two
  WebSocket protocols share `stream_socket.py` (fMP4 out, text in, the control loop).
- `app.py` (lifespan and wiring) and `routes/` (one FastAPI router per surface).
- `clients/`: the Python clients (WebRTC, stream, LiveKit user).

Dependencies point down: transport imports sessions, engine and models, never the reverse.
"""
