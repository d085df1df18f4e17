"""A session's recording over HTTP: GET /v1/sessions/{id}/recording (its video, MP4) and
GET /v1/sessions/{id}/recording/events (its event log, JSON Lines).

Served to the session's own token while the session lives and, after it closes, for the recording's retention
time (`sessions/recording.py` `Recordings`); a viewer token, another session's token or an unknown id get the
same 404 as on the session's other routes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import StreamingResponse

from worldcast.sessions.errors import RecordingNotFound
from worldcast.sessions.recording import EVENTS_FILE, VIDEO_FILE
from worldcast.transport.http.routes.deps import NOT_FOUND_DETAIL, bearer_token

router = APIRouter()

#: Bytes read from the log at a time.
CHUNK_BYTES = 64 * 1024


def _complete_lines(path: Path, size: int) -> Iterator[bytes]:
    """The log's first `size` bytes, up to its last complete line (a log being written may end mid-line)."""
    with open(path, "rb") as f:
        data_left = size
        pending = b""
        while data_left > 0:
            block = f.read(min(CHUNK_BYTES, data_left))
            if not block:
                break
            data_left -= len(block)
            block = pending + block
            cut = block.rfind(b"\n") + 1
            pending = block[cut:]
            if cut:
                yield block[:cut]


def _first_bytes(path: Path, size: int) -> Iterator[bytes]:
    """The file's first `size` bytes (a video being written grows behind the reader)."""
    with open(path, "rb") as f:
        left = size
        while left > 0 and (block := f.read(min(CHUNK_BYTES, left))):
            left -= len(block)
            yield block


def _recording_file(request: Request, session_id: str, authorization: str | None, name: str) -> Path:
    """The file `name` of the session's recording, if the bearer token may read it.

    Raises:
        HTTPException: 401 without a Bearer token; 404 for no such recording file for this token.
    """
    token = bearer_token(authorization)
    if token is None:
        raise HTTPException(401, "missing 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"})
    store = request.app.state.manager.recordings
    if store is None:
        raise HTTPException(404, NOT_FOUND_DETAIL)
    try:
        return store.events(session_id, token, name)  # type: ignore[no-any-return]
    except RecordingNotFound:
        raise HTTPException(404, NOT_FOUND_DETAIL) from None


@router.get("/v1/sessions/{session_id}/recording",
            responses={200: {"content": {"video/mp4": {}}, "description": "the video, fragmented MP4"}})
def recording_video(session_id: str, request: Request,
                    authorization: Annotated[str | None, Header()] = None) -> StreamingResponse:
    """The recording's video as it stands: the session's one H.264 encode as fragmented MP4 (the moov first, so
    it plays while it grows; `transport/stream/recording.py`).

    Raises:
        HTTPException: 401 without a Bearer token; 404 for no recorded video of this session for this token.
    """
    path = _recording_file(request, session_id, authorization, VIDEO_FILE)
    return StreamingResponse(_first_bytes(path, path.stat().st_size), media_type="video/mp4",
                             headers={"Content-Disposition": f'attachment; filename="{session_id}.mp4"'})


@router.get("/v1/sessions/{session_id}/recording/events",
            responses={200: {"content": {"application/jsonl": {}}, "description": "the event log, JSON Lines"}})
def recording_events(session_id: str, request: Request,
                     authorization: Annotated[str | None, Header()] = None) -> StreamingResponse:
    """The session's recording event log as it stands (complete lines; see docs/recordings.md).

    Raises:
        HTTPException: 401 without a Bearer token; 404 for no recording of this session for this token.
    """
    path = _recording_file(request, session_id, authorization, EVENTS_FILE)
    size = path.stat().st_size
    return StreamingResponse(_complete_lines(path, size), media_type="application/jsonl",
                             headers={"Content-Disposition": f'attachment; filename="{session_id}.events.jsonl"'})
