"""The network edge: HTTP/WebSocket API, WebRTC, CLI."""
