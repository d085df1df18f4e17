"""WhepPlayer: a minimal WHEP player (draft-ietf-wish-whep) over aiortc, for benchmarks and tools.

It offers one recvonly video m-line (every codec aiortc has, or VP8 only), POSTs the offer with a bearer
token, applies the `201 Created` answer, and DELETEs the `Location` resource when it closes (the draft's
way to leave). It gathers before it offers (aiortc does), so it needs no trickle. docs/sharing.md has the
server's side.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import av
import httpx
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription

#: How long `close` waits for the DELETE, s (a player that leaves must not hang on a dead server).
DELETE_TIMEOUT_S = 5.0


class WhepPlayer:
    """One WHEP player. Create with `play`; `next_frame` returns decoded pictures; `close` leaves.

    Attributes:
        location: the WHEP resource URL (absolute).
        answer_sdp: the server's SDP answer.
    """

    def __init__(self, pc: RTCPeerConnection, location: str, answer_sdp: str, token: str) -> None:
        self.pc, self.location, self.answer_sdp, self.token = pc, location, answer_sdp, token
        self._track: Any = None
        self._got_track = asyncio.Event()
        self._closed = False

    @classmethod
    async def play(cls, whep_url: str, token: str, *, vp8_only: bool = False,
                   timeout_s: float = 30.0) -> WhepPlayer:
        """Offer, POST to `whep_url` with `token` (a viewer token), apply the answer.

        Args:
            whep_url: the session's WHEP endpoint (absolute, as `POST /v1/sessions/{id}/viewers` returns it).
            vp8_only: offer only VP8 (the server then encodes for this player alone).

        Raises:
            httpx.HTTPStatusError: the server refused the offer (its status and reason).
        """
        pc = RTCPeerConnection()
        transceiver = pc.addTransceiver("video", direction="recvonly")
        if vp8_only:
            caps = RTCRtpReceiver.getCapabilities("video")
            assert caps is not None, "aiortc receives video"
            transceiver.setCodecPreferences([c for c in caps.codecs if c.mimeType in ("video/VP8", "video/rtx")])
        tracks: list[Any] = []
        got = asyncio.Event()

        @pc.on("track")
        def _on_track(track: Any) -> None:
            tracks.append(track)
            got.set()

        try:
            await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers before it returns
            async with httpx.AsyncClient(timeout=timeout_s) as http:
                r = await http.post(whep_url, content=pc.localDescription.sdp,
                                    headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {token}"})
                if r.is_error:  # the refusal's reason with its status (raise_for_status keeps only the status)
                    raise httpx.HTTPStatusError(f"WHEP offer refused: {r.status_code} {r.reason_phrase}: "
                                                f"{r.text[:500]}", request=r.request, response=r)
            location = str(httpx.URL(whep_url).join(r.headers["location"]))
            await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
        except BaseException:
            await pc.close()
            raise
        self = cls(pc, location, r.text, token)
        if tracks:
            self._track = tracks[0]
            self._got_track.set()
        else:
            def _on_later(track: Any) -> None:
                self._track = track
                self._got_track.set()
            pc.on("track", _on_later)
        return self

    async def next_frame(self, timeout_s: float = 15.0) -> av.VideoFrame:
        """The next decoded picture.

        Raises:
            TimeoutError: none within `timeout_s`.
            aiortc.mediastreams.MediaStreamError: the track ended.
        """
        await asyncio.wait_for(self._got_track.wait(), timeout_s)
        frame: av.VideoFrame = await asyncio.wait_for(self._track.recv(), timeout_s)
        return frame

    async def close(self) -> None:
        """DELETE the resource (bounded by `DELETE_TIMEOUT_S`) and close the peer connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=DELETE_TIMEOUT_S) as http:
                await http.delete(self.location, headers={"Authorization": f"Bearer {self.token}"})
        await self.pc.close()
