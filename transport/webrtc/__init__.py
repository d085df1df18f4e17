"""WebRTC (aiortc): a session's video track and data channels, one peer connection per offer.

- `peer.py`: `WebRTCPeer`, the adapter over the connection core (`transport/connection.py`): answers an
  offer, publishes the track, serves the `actions` and `control` data channels, and owns its teardown.
- `registry.py`: `PeerRegistry`, every peer of a server by session (live and pending; make-before-break
  renegotiation).
- `sdp.py`: offer validation, before any peer connection is made or replaced.
- `video_track.py`: `SessionVideoTrack`, the session's frames as an aiortc video track (a `FrameSink`).
- `ice.py`: process-wide ICE settings (aioice host addresses, consent timeout) and a peer's safe close.

The signalling route is `transport/http/routes/webrtc.py`; the Python client is `transport/clients/webrtc.py`.
"""
