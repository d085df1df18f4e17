"""The WebSocket surfaces: the worldcast stream (WS /v1/sessions/{id}/stream, `stream/connection.py`) and
Dreamverse's WS /ws (`dreamverse/serve.py`), with the Dreamverse client's HTTP reads (GET /status,
/prompt-system-config, /curated-presets: `dreamverse/http.py`)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from worldcast.transport.dreamverse.http import router as dreamverse_http_router
from worldcast.transport.dreamverse.serve import serve_dreamverse
from worldcast.transport.stream.connection import serve_stream

router = APIRouter()
router.include_router(dreamverse_http_router)


@router.websocket("/v1/sessions/{session_id}/stream")
async def stream(websocket: WebSocket, session_id: str) -> None:
    st = websocket.app.state
    await serve_stream(websocket, session_id, manager=st.manager, streams=st.streams,
                       video_scale=st.config.scale_for(st.model),
                       make_guard=st.make_guard, on_frames=st.metrics.on_stream_frames, viewers=st.config.viewers)


@router.websocket("/ws")
async def dreamverse(websocket: WebSocket) -> None:
    st = websocket.app.state
    c = st.config
    await serve_dreamverse(websocket, manager=st.manager, video_scale=c.scale_for(st.model),
                           segment_s=c.dreamverse_segment_s, session_timeout_s=c.dreamverse_session_timeout_s,
                           segment_cap=c.dreamverse_segment_cap, make_guard=st.make_guard,
                           on_frames=st.metrics.on_stream_frames)
