"""LiveKit edge: a session's world joins a LiveKit room as a participant.

- `config.py`: `LiveKitConfig` (URL, API key and secret, token lifetime, video source kind).
- `tokens.py`: access tokens for the world and its user, and participant identities.
- `source.py`: `LiveKitVideoSink`, the session's frame sink feeding a LiveKit video source.
- `world.py`: `LiveKitWorld`, one session's participant (video track, `actions` data,
  control RPCs, per-frame metadata), an adapter over the connection core
  (`transport/connection.py`), and `LiveKitWorlds`, every world of a server.
- `rpc.py`: control RPCs as LiveKit RPC methods, errors mapped to LiveKit codes.
- `worker.py`: `AgentWorker`, the LiveKit agent worker protocol (explicit dispatch).

The Python user client is `transport/clients/livekit.py`.

Needs the `livekit` extra (`livekit`, `livekit-api`, `livekit-protocol`); nothing
else in worldcast imports this package unless LiveKit is configured.
"""
