"""A session's user over LiveKit (Python SDK), for tests and benchmarks.

    async with await LiveKitUser.create("http://127.0.0.1:8000", room="r1", seed=1) as u:
        frame = await u.next_frame()          # ReceivedFrame: .image (H, W, 3) uint8 RGB, .pts (90 kHz)
        u.send_action(keys=["d"])             # data packet on topic `actions`
        await u.rpc("flush")                  # LiveKit RPC on the world participant

`create` makes the session over HTTP (`"transport": "livekit"`) and joins
with the token the reply carries; `join` joins a room with a token of the
caller's own (the dispatch path), and the world is whichever participant
publishes the `worldcast-` identity. The same attributes as
`clients.webrtc.WebRTCClient` (`seq`, `sent_at`, `frame_events`,
`answered_at`, `send_action`, `next_frame`), so the benchmark's probe
drives either.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from livekit import rtc

from worldcast.sessions.clock import VIDEO_CLOCK_RATE
from worldcast.transport.clients.session_api import (
    EventWaiters,
    action_message,
    create_session,
    next_seq,
    remember_sent,
)
from worldcast.transport.livekit.tokens import WORLD_PREFIX
from worldcast.transport.livekit.world import ACTIONS_TOPIC, EVENTS_TOPIC, FRAMES_TOPIC, USER_ATTRIBUTE

#: Longest wait for the world to join and its track to arrive, s.
WORLD_TIMEOUT_S = 20.0
#: Data topic on which workers tell a room that a dispatch was declined (`worker.py`).
DISPATCH_TOPIC = "worldcast.dispatch"


@dataclass(frozen=True)
class ReceivedFrame:
    """A decoded frame from the world's track.

    Attributes:
        image: uint8 (H, W, 3) RGB.
        pts: the frame's PTS, 90 kHz (from the world's frame metadata; else the SDK's `timestamp_us`).
        timestamp_us: the SDK's capture timestamp, µs.
        arrival_s: client monotonic time it came out of the stream, s.
    """

    image: np.ndarray
    pts: int
    timestamp_us: int
    arrival_s: float

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    def to_ndarray(self, format: str = "rgb24") -> np.ndarray:  # noqa: A002 - PyAV's name
        """The picture as rgb24 (H, W, 3) or gray (H, W) uint8 (BT.601 luma), like `av.VideoFrame`."""
        if format == "gray":
            return (self.image @ np.array([0.299, 0.587, 0.114], np.float32)).round().astype(np.uint8)
        return self.image


class LiveKitUser:
    """The user participant of one session. Create with `create` or `join`."""

    def __init__(self, *, session_id: str | None = None, token: str | None = None, model: dict[str, Any] | None = None,
                 base_url: str | None = None, world_identity: str | None = None) -> None:
        self.session_id = session_id
        self.token = token
        self.model = model or {}
        self.base_url = base_url
        self.world_identity = world_identity
        self.room = rtc.Room()
        self.seq = -1
        self.sent_at: dict[int, float] = {}
        self.frame_events: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.events: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.dispatch_events: deque[dict[str, Any]] = deque(maxlen=1000)
        self.answered_at = 0.0
        self._track: rtc.RemoteVideoTrack | None = None
        self._track_ready = asyncio.Event()
        self._world_seen = asyncio.Event()
        self._stream: rtc.VideoStream | None = None
        self._sends: set[asyncio.Task[Any]] = set()
        self._waiters = EventWaiters()
        self.room.on("track_subscribed", self._on_track)
        self.room.on("data_received", self._on_data)
        self.room.on("participant_connected", self._on_participant)

    # -- joining ---------------------------------------------------------------------------------

    @classmethod
    async def create(cls, base_url: str, *, room: str | None = None, prompt: str | None = None,
                     seed: int | None = None, stamp_frames: bool = False) -> LiveKitUser:
        """Create a LiveKit session over HTTP and join its room as the user.

        Args:
            room: the room to create it in; None: the server names a fresh one (`room` of the reply).

        Raises:
            httpx.HTTPStatusError: creation refused (503 when full, 502 when the world could not join,
                409 when the room is another session's or already exists on the LiveKit server).
        """
        fields: dict[str, Any] = {"transport": "livekit"}
        if room is not None:
            fields["room"] = room
        info = await create_session(base_url, prompt=prompt, seed=seed, stamp_frames=stamp_frames, **fields)
        lk = info["livekit"]
        self = cls(session_id=info["session_id"], token=info["token"], model=info["model"], base_url=base_url,
                   world_identity=lk["world_identity"])
        try:
            await self._connect(lk["url"], lk["token"])
        except BaseException:
            await self.aclose(delete=True)
            raise
        return self

    @classmethod
    async def join(cls, url: str, token: str) -> LiveKitUser:
        """Join a room with the caller's own token; the world is found when it joins (`wait_world`)."""
        self = cls()
        await self._connect(url, token)
        return self

    async def _connect(self, url: str, token: str) -> None:
        await self.room.connect(url, token, rtc.RoomOptions(auto_subscribe=True))
        self.answered_at = time.monotonic()
        # announce ourselves to the world at once (see transport/livekit/world.py)
        await self.room.local_participant.set_attributes({USER_ATTRIBUTE: "user"})
        for p in self.room.remote_participants.values():
            self._on_participant(p)

    def _on_participant(self, p: rtc.RemoteParticipant) -> None:
        if self.world_identity is None and p.identity.startswith(WORLD_PREFIX):
            self.world_identity = p.identity
        if p.identity == self.world_identity:
            self._world_seen.set()

    async def wait_world(self, timeout_s: float = WORLD_TIMEOUT_S) -> str:
        """Wait until the world participant is in the room; returns its identity.

        Raises:
            TimeoutError: it did not join in time.
        """
        await asyncio.wait_for(self._world_seen.wait(), timeout_s)
        assert self.world_identity is not None
        return self.world_identity

    def _on_track(self, track: rtc.Track, pub: rtc.RemoteTrackPublication, p: rtc.RemoteParticipant) -> None:
        if track.kind == rtc.TrackKind.KIND_VIDEO and p.identity == self.world_identity:
            self._track = track  # type: ignore[assignment]
            self._stream = rtc.VideoStream(track, format=rtc.VideoBufferType.RGB24, capacity=4)
            self._track_ready.set()

    # -- data ---------------------------------------------------------------------------------------

    def _on_data(self, packet: rtc.DataPacket) -> None:
        """Keep the world's frame metadata and events, and workers' dispatch notes.

        Only the world's participant (`world_identity`) speaks on `frames` and `events`: anyone else in
        the room publishing there (another participant who joined it, issue 31) is ignored, never
        recorded as the session's event. Until the world is known nothing on those topics is taken.
        """
        sender = packet.participant.identity if packet.participant is not None else None
        if packet.topic in (FRAMES_TOPIC, EVENTS_TOPIC) and (sender is None or sender != self.world_identity):
            return
        try:
            msg = json.loads(packet.data)
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        msg["received_at"] = time.monotonic()
        if packet.topic == FRAMES_TOPIC:
            self.frame_events.append(msg)
        elif packet.topic == EVENTS_TOPIC:
            self.events.append(msg)
        elif packet.topic == DISPATCH_TOPIC:
            self.dispatch_events.append(msg)
        else:
            return
        self._waiters.notify(msg)

    async def wait_event(self, predicate: Any, timeout_s: float = 10.0) -> dict[str, Any]:
        """Wait for the next message on `frames`, `events` or `worldcast.dispatch` matching `predicate`."""
        return await self._waiters.wait(predicate, timeout_s)

    def _publish(self, payload: bytes | str, *, topic: str, destination: list[str] | None = None) -> None:
        dest = destination if destination is not None else ([self.world_identity] if self.world_identity else [])
        t = asyncio.get_running_loop().create_task(self.room.local_participant.publish_data(
            payload, reliable=True, topic=topic, destination_identities=dest))
        self._sends.add(t)
        t.add_done_callback(self._sends.discard)

    def send_action(self, keys: list[str] | None = None, mouse: tuple[float, float] = (0, 0),
                    axes: dict[str, float] | None = None) -> int:
        """Send one action message on topic `actions` (`session_api.action_message`, types checked: this client
        keeps no model); returns its seq."""
        now = time.monotonic()
        msg = action_message({}, next_seq(self.seq), now, keys, mouse, axes)
        self.seq = msg["seq"]  # restarts at 0 before the server's limit (2**53)
        remember_sent(self.sent_at, self.seq, now)
        self._publish(json.dumps(msg), topic=ACTIONS_TOPIC)
        return self.seq

    def send_raw(self, payload: bytes | str, *, topic: str = ACTIONS_TOPIC) -> None:
        """Send any payload on any topic to the world (for error tests)."""
        self._publish(payload, topic=topic)

    async def rpc(self, method: str, params: dict[str, Any] | None = None, *, payload: str | None = None,
                  timeout_s: float = 10.0) -> dict[str, Any]:
        """Call a control RPC on the world and return its result.

        Args:
            payload: send this exact payload instead of `params` as JSON (for error tests).

        Raises:
            rtc.RpcError: the world answered with an error (see `transport/errors.LIVEKIT_RPC_CODE`).
        """
        assert self.world_identity is not None, "no world yet"
        out = await self.room.local_participant.perform_rpc(
            destination_identity=self.world_identity, method=method,
            payload=payload if payload is not None else json.dumps(params or {}), response_timeout=timeout_s)
        return json.loads(out) if out else {}

    # -- frames -----------------------------------------------------------------------------------------

    async def next_frame(self, timeout_s: float = 10.0) -> ReceivedFrame:
        """The next decoded frame of the world's track (blank frames before the world's first are skipped).

        Raises:
            TimeoutError: none within `timeout_s`.
            ConnectionError: the stream ended.
        """
        await asyncio.wait_for(self._track_ready.wait(), timeout_s)
        assert self._stream is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ev = await asyncio.wait_for(self._stream.__anext__(), max(0.001, deadline - time.monotonic()))
            except StopAsyncIteration:
                raise ConnectionError("the world's video stream ended") from None
            # the SDK sends blank frames until the world's first one: those carry no PTS in their metadata
            if (ev.metadata is not None and ev.metadata.HasField("user_timestamp")) or self.frame_events:
                break
        now = time.monotonic()
        f = ev.frame
        if f.type != rtc.VideoBufferType.RGB24:
            f = f.convert(rtc.VideoBufferType.RGB24)
        image = np.frombuffer(f.data, dtype=np.uint8).reshape(f.height, f.width, 3).copy()
        # the world sends the PTS as frame metadata; the render timestamp is 0 without playout delay
        md = ev.metadata
        pts_us = md.user_timestamp if md is not None and md.HasField("user_timestamp") else ev.timestamp_us
        return ReceivedFrame(image, pts_us * VIDEO_CLOCK_RATE // 1_000_000, ev.timestamp_us, now)

    # -- teardown ---------------------------------------------------------------------------------------

    async def aclose(self, *, delete: bool = False) -> None:
        """Leave the room (the server then closes the session); `delete` also DELETEs it over HTTP."""
        if self._stream is not None:
            await self._stream.aclose()
            self._stream = None
        for t in list(self._sends):
            t.cancel()
        await self.room.disconnect()
        if delete and self.base_url and self.session_id:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=10) as http:
                try:
                    await http.delete(f"/v1/sessions/{self.session_id}",
                                      headers={"Authorization": f"Bearer {self.token}"})
                except httpx.HTTPError:
                    pass

    async def __aenter__(self) -> LiveKitUser:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
