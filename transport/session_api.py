"""The HTTP calls every worldcast client makes around a session: create it, delete it.

Shared by the WebRTC client (`client.py`), the WebSocket stream client
(`ws_client.py`) and the LiveKit user (`livekit/client.py`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import httpx


async def create_session(base_url: str, *, prompt: str | None = None, seed: int | None = None,
                         stamp_frames: bool = False, timeout_s: float = 60.0, **fields: Any) -> dict[str, Any]:
    """POST /v1/sessions and return the reply ({"session_id", "token", "model", ...}).

    Args:
        prompt, seed, stamp_frames: the common fields (omitted when None / False).
        fields: further body fields (e.g. mode="directing", transport="livekit", room=...).

    Raises:
        httpx.HTTPStatusError: creation refused (503 with Retry-After when the server is full).
    """
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if prompt is not None:
        body["prompt"] = prompt
    if seed is not None:
        body["seed"] = seed
    if stamp_frames:
        body["stamp_frames"] = True
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
        r = await http.post("/v1/sessions", json=body)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


async def delete_session(base_url: str, session_id: str, token: str, *, timeout_s: float = 10.0) -> None:
    """DELETE /v1/sessions/{id}, ignoring transport errors (best effort, for clean-up paths)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
        with contextlib.suppress(httpx.HTTPError):
            await http.delete(f"/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {token}"})
