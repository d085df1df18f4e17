"""Dreamverse's `WS /ws`: FastVideo's Dreamverse browser client, served unchanged (docs/streaming.md).

- `serve.py`: admission (queue status, `session_init_v2`, a directing session of the socket's own).
- `connection.py`: `DreamverseConnection`, the incoming half: the adapter that checks each client message
  and drives the project and the directing layer, over the connection core and the fMP4 socket it shares
  with the worldcast stream (`transport/stream/socket.py`).
- `events.py`: `DreamverseEvents`, the outgoing half: every message the client reads, in its order.
- `messages.py`: the client's messages checked; `prompts.py`: its prompts and project start parsed.
- `http.py`: the client's HTTP reads (`GET /status`, `/prompt-system-config`, `/curated-presets`).
"""
