"""The HTTP and WebSocket routes, one `APIRouter` per surface; `transport/http/app.py` wires them.

- `sessions.py`: create, read and delete a session; its HTTP RPC.
- `webrtc.py`: the SDP offer of a session's WebRTC peer.
- `streams.py`: the worldcast stream (WS /v1/sessions/{id}/stream) and Dreamverse's WS /ws with its
  client's HTTP reads (`transport/dreamverse/http.py`).
- `admin.py`: the model, the model families, the agent worker, the engines (`engine_api.py`).
- `health.py`: liveness, readiness, Prometheus metrics.

Routes read what they serve from `request.app.state` (`config`, `manager`, `peers`, `metrics`, ...),
set by `create_app` and its lifespan; `deps.py` has the dependencies they share (a session's token).
"""
