"""The Python clients of a worldcast server (used by tests, `latency_bench` and `worldcast direct`).

- `webrtc.py`: `WebRTCClient`, a session over WebRTC (aiortc): video track, `actions` and `control` channels.
- `stream.py`: `StreamClient`, a session over the WebSocket stream (fMP4 video, events, actions, RPCs).
- `livekit.py`: the session's LiveKit user (joins the room, sends actions, calls the world's RPCs).
- `session_api.py`: what every client does around a session over HTTP (create, delete, key checks, seq).
- `direct.py`: `worldcast direct`, timed directions over a `StreamClient`, the film written to an MP4 file.
- `errors.py`: every error the clients raise (`UnknownKey`, `MessageTooLarge`, `RpcFailed`, `StreamError`).

Clients import nothing of the server's connection core; they speak the wire formats of docs/ (api.md, streaming.md).
"""

from worldcast.transport.clients.errors import MessageTooLarge, RpcFailed, StreamError, UnknownKey
from worldcast.transport.clients.stream import StreamClient, StreamFrame
from worldcast.transport.clients.webrtc import WebRTCClient

__all__ = ["MessageTooLarge", "RpcFailed", "StreamClient", "StreamError", "StreamFrame", "UnknownKey", "WebRTCClient"]
