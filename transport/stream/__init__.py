"""fMP4 over one WebSocket: the socket both WebSocket protocols share, and the worldcast stream on it.

- `socket.py`: `StreamSocket`, protocol-neutral: the session's frames through the fMP4 sink, the outbound
  queue, text in (size- and rate-checked, then handed to the protocol), one control loop, one close.
- `connection.py`: the worldcast stream (`WS /v1/sessions/{id}/stream`, docs/streaming.md):
  `StreamConnection`, its authentication and admission (`serve_stream`). Dreamverse's `/ws` is the other
  protocol over `StreamSocket` (`transport/dreamverse/`).
- `queue.py`: `OutboundQueue` (media dropped for a reader that stops reading, control never) and
  `FrameAccount` (frames per directing segment).
- `fmp4.py`: the H.264 encoder and fragmenter (`Fmp4Encoder`, `Fmp4Fragmenter`), a session's one shared encode
  (`SessionEncode`) and each stream's sink over it (`Fmp4Sink`);
  `mp4box.py`: the ISO BMFF boxes it writes itself.
"""
