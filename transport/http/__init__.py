"""The HTTP edge: the FastAPI app every protocol is served from, its routes, and what guards its requests.

- `app.py`: `create_app`, the wiring and lifespan (every object of a server, hung on `app.state`).
- `routes/`: one `APIRouter` per surface (sessions and RPC, WebRTC's offer, the WebSocket streams,
  admin, health); `engine_api.py` (building the engines, their routes) and `model_api.py` (what the API
  says about models; create bodies, their starting images decoded by `images.py`) behind them.
- `body.py`: what a request body may be (ASGI middleware); `conn_limits.py`: request-head timeout and
  connections per client, in uvicorn's own HTTP protocol, below ASGI.
- `metrics.py`: Prometheus metrics, at `GET /metrics` and on the optional metrics listener.
"""
