"""LiveKitWorld: one session's world, a participant in a LiveKit room.

A protocol translation over the connection core (`transport/connection.py`: guard, feedback, action
dispatch, the frame event, the close): data packets and LiveKit RPCs in, data packets out, and the room's
own teardown.

The world joins the room with identity `worldcast-<session id>`, publishes
one video track (the session's frames, see `source.py`) and serves the
session's *user*, one participant named up front (or, when none is named,
the first non-agent participant to join):

- user -> world, data topic `actions`: action messages, parsed by
  `transport/rpc.ActionHandler` exactly as on the WebRTC `actions` data
  channel. Packets on other topics or from anyone else are dropped and
  logged; a rejected action is answered on `events`.
- RPC methods `flush`, `cancel`, `set_prompt`, `pause`, `resume`,
  `get_state` on the world participant (`rpc.py`).
- world -> user, data topic `frames` (reliable, so ordered with RPC replies: no
  frame of an older epoch follows a flush reply): per-frame metadata as on the
  WebRTC control channel (`frame_index`, `pts`, `action_seq`, `epoch`,
  `lateness_ms`, `timings_ms`), sent when the frame is handed to LiveKit;
  topic `events` (reliable): `state`, `error`, `action_rejected`.

The video sink is attached when the user is in the room (generation starts
then, as with a WebRTC answer). LiveKit announces a participant that
publishes no media to the others in batches, every 3 s
(livekit-server pkg/rtc/room.go, `subscriberUpdateInterval`), but at once
when it changes its attributes; until the world knows the user, the
user's packets carry no sender and are dropped. So users set an attribute
on joining (worldcast's clients set `worldcast.role: user`; the user's
token allows it). The user leaving closes the session, which
frees its slot; the session closing (DELETE, timeout, failure, shutdown)
makes the world leave. `LiveKitWorlds` holds every world of a server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from livekit import rtc
from livekit.rtc._proto import participant_pb2

from worldcast.sessions.frames import VideoFrame
from worldcast.sessions.manager import SessionManager
from worldcast.sessions.session import CloseReason, Session, SessionState
from worldcast.sessions.viewers import Viewer
from worldcast.transport.connection import Connection, frame_event
from worldcast.transport.errors import LiveKitJoinError, LiveKitRoomTaken
from worldcast.transport.limits import InputGuard
from worldcast.transport.livekit.config import LiveKitConfig
from worldcast.transport.livekit.rpc import LiveKitRpc
from worldcast.transport.livekit.source import LiveKitVideoSink, make_publisher
from worldcast.transport.livekit.tokens import (
    user_identity,
    user_token,
    viewer_identity,
    viewer_token,
    world_identity,
    world_token,
)
from worldcast.transport.schemas import LiveKitAccess

logger = logging.getLogger(__name__)

#: Data topics (LiveKit `DataPacket.topic`).
ACTIONS_TOPIC, FRAMES_TOPIC, EVENTS_TOPIC = "actions", "frames", "events"
#: The attribute worldcast's clients set on joining (any attribute change makes LiveKit announce them).
USER_ATTRIBUTE = "worldcast.role"
#: A user joining this long after its token's TTL is removed (the claims' whole-second rounding), s.
LATE_JOIN_SLACK_S = 2.0
#: How long a flooding user's `disconnect` event has to arrive before the user is removed from the room, s.
FLOOD_REMOVE_DELAY_S = 0.5
#: Sends in flight past which frame metadata is dropped rather than queued.
MAX_FRAME_SENDS = 8


#: Prefix of the rooms the server names (a create over HTTP without `room`).
SERVER_ROOM_PREFIX = "worldcast-room-"


def server_room_name() -> str:
    """A fresh room name of the server's own (`SERVER_ROOM_PREFIX` and 96 random bits, URL-safe)."""
    return SERVER_ROOM_PREFIX + secrets.token_urlsafe(12)


class LiveKitWorld:
    """One session's participant in a LiveKit room.

    Args:
        session: the session it serves.
        room_name: the LiveKit room.
        user_identity: the session's user (None: the first non-agent participant to join).
        config: LiveKit settings.
        video_scale: integer upscale of the published video.
        on_user_left: called once when the user leaves or the room connection is lost.
    """

    def __init__(self, session: Session, *, room_name: str, user_identity: str | None, config: LiveKitConfig,
                 video_scale: int = 1,
                 on_user_left: Callable[[LiveKitWorld], None] | None = None,
                 guard: InputGuard | None = None) -> None:
        self.session = session
        self.room_name = room_name
        self.identity = world_identity(session.id)
        self.user_identity = user_identity
        self.config = config
        self.room = rtc.Room()
        #: the connection core (guard, feedback, action dispatch, tasks, the close); a flooding user is told,
        #: removed from the room through the room service, and its packets are dropped for the rest of the session
        self.conn = Connection(session, send=self.send_event, on_flood=self._on_flood, guard=guard,
                               name="livekit-world")
        self.guard, self.feedback = self.conn.guard, self.conn.feedback
        self.rpc = LiveKitRpc(session, user_identity=lambda: self.user_identity, guard=self.guard,
                              feedback=self.feedback)
        spec = session.model.spec
        self.width, self.height = spec.frame_width * video_scale, spec.frame_height * video_scale
        self.fps = float(spec.fps)
        self.publisher = make_publisher(config.source, self.width, self.height,
                                        max_bitrate_bps=config.max_bitrate_bps, fps=self.fps)
        self.sink = LiveKitVideoSink(self.publisher, session.frames.is_current, scale=video_scale,
                                     stamp=session.stamp_frames, on_published=self._on_published)
        self._on_user_left = on_user_left
        #: Unix time after which the user may no longer join (its token's TTL); a later join is removed
        #: through the room service (None: no deadline, e.g. a dispatched user with its own token)
        self.join_deadline_s: float | None = None
        self.removed: list[tuple[str, str]] = []  #: (identity, why) of participants removed from the room
        self._attached = False
        self._left_called = False
        self.dropped: dict[str, int] = {"topic": 0, "sender": 0, "flood": 0}  #: data packets dropped, by reason
        self.frame_events_dropped = 0  #: frame metadata not sent (too many sends in flight)
        self.room.on("participant_connected", self._on_participant_connected)
        self.room.on("participant_disconnected", self._on_participant_disconnected)
        self.room.on("data_received", self._on_data)
        self.room.on("disconnected", self._on_disconnected)

    def __repr__(self) -> str:
        return f"LiveKitWorld({self.session.id}, room {self.room_name!r})"

    # -- joining -----------------------------------------------------------------------------------

    async def join(self, url: str | None = None, token: str | None = None) -> None:
        """Connect to the room, publish the track, register the RPCs; attach if the user is there.

        Args:
            url: LiveKit URL (default: the config's).
            token: the world's access token (default: minted from the config's key and secret;
                dispatch hands one over).

        Raises:
            LiveKitJoinError: no connection within `join_timeout_s`, or publishing failed.
        """
        token = token or world_token(self.config, room=self.room_name, identity=self.identity)
        try:
            await asyncio.wait_for(self.room.connect(url or self.config.ws_url, token,
                                                     rtc.RoomOptions(auto_subscribe=False)),
                                   self.config.join_timeout_s)
            self.rpc.register(self.room.local_participant)
            track = rtc.LocalVideoTrack.create_video_track("worldcast", self.publisher.source)  # type: ignore[arg-type]
            await asyncio.wait_for(self.room.local_participant.publish_track(
                track, self.publisher.publish_options(max_bitrate_bps=self.config.max_bitrate_bps, fps=self.fps)),
                self.config.join_timeout_s)
        except Exception as e:  # noqa: BLE001 - rtc.ConnectError, a timeout, a refused publication: all one error
            await self.aclose()
            raise LiveKitJoinError(f"could not join LiveKit room {self.room_name!r} at "
                                   f"{url or self.config.ws_url}: {type(e).__name__}: {e}") from e
        self.sink.start()
        self.conn.subscribe(self.session.on("state", self._on_state),
                            self.session.on("error", lambda s, r: self.send_event(
                                {"event": "error", "code": getattr(r, "code", "session_failed"), "message": str(r)})))
        logger.info("%r: joined as %s (%s source), user %s", self, self.identity, self.config.source.value,
                    self.user_identity or "(first to join)")
        for p in list(self.room.remote_participants.values()):
            self._on_participant_connected(p)

    # -- participants ------------------------------------------------------------------------------

    def _is_user(self, p: rtc.RemoteParticipant) -> bool:
        if self.user_identity is None and p.kind != participant_pb2.ParticipantKind.PARTICIPANT_KIND_AGENT:
            self.user_identity = p.identity  # claimed by the first non-agent participant
        return p.identity == self.user_identity

    def _on_participant_connected(self, p: rtc.RemoteParticipant) -> None:
        if self.conn.closing or self._attached or not self._is_user(p):
            return
        if self.join_deadline_s is not None and time.time() > self.join_deadline_s + LATE_JOIN_SLACK_S:
            # the server's leeway (tokens.SERVER_LEEWAY_S) lets a token in for a minute past its exp:
            # the world removes a user who joins after its token's TTL
            logger.warning("%r: user %s joined %.1f s after its token's TTL: removing it", self, p.identity,
                           time.time() - self.join_deadline_s)
            self._spawn(self.remove_participant(p.identity, "joined after its token's TTL"))
            return
        try:
            self.session.inputs.new_client()
            self.session.attach_sink(self.sink)
        except Exception:  # noqa: BLE001 - the session closed meanwhile
            logger.info("%r: user %s joined a closed session", self, p.identity)
            return
        self._attached = True
        logger.info("%r: user %s joined; streaming", self, p.identity)

    def _on_participant_disconnected(self, p: rtc.RemoteParticipant) -> None:
        if p.identity == self.user_identity and self._attached:
            logger.info("%r: user %s left", self, p.identity)
            self._user_left()

    def _on_disconnected(self, reason: Any = None) -> None:
        if not self.conn.closing:
            logger.info("%r: room connection lost (%s)", self, reason)
            self._user_left()

    def _user_left(self) -> None:
        if not self._left_called:
            self._left_called = True
            if self._on_user_left is not None:
                self._on_user_left(self)

    def _on_state(self, session: Session, state: object) -> None:
        if state == SessionState.CLOSED:
            self._spawn(self.aclose())
        else:
            self.send_event({"event": "state", "state": state.name.lower()})  # type: ignore[attr-defined]

    # -- data ---------------------------------------------------------------------------------------

    def _on_data(self, packet: rtc.DataPacket) -> None:
        sender = packet.participant.identity if packet.participant is not None else None
        from_user = bool(sender) and sender == self.user_identity
        now = time.monotonic()
        if from_user and self.conn.silenced("actions", now):
            self._drop("flood", f"packet from {sender!r} after its flood verdict")
            return
        if packet.topic != ACTIONS_TOPIC:
            self._drop("topic", f"data packet on topic {packet.topic!r} from {sender!r} ({len(packet.data)} bytes)")
            if from_user:  # the user's packets of every topic count toward its flood verdict
                self.feedback.send_all(self.guard.rejected_message(
                    "actions", "unknown_topic", f"data topic {packet.topic[:64]!r} is not served; actions go on "
                    f"{ACTIONS_TOPIC!r}", now, outcome="invalid"))
            return
        if not from_user:
            self._drop("sender", f"action packet from {sender!r}, not the session's user")
            return
        self.conn.take_action(packet.data, now)

    def _on_flood(self, verdict: dict[str, Any]) -> None:
        logger.warning("%r: %s; removing the user from the room", self, verdict["message"])
        if self.user_identity is not None:  # its packets are dropped from now on, and it is removed
            self._spawn(self._remove_later(self.user_identity, "flood"))

    async def _remove_later(self, identity: str, why: str) -> None:
        await asyncio.sleep(FLOOD_REMOVE_DELAY_S)  # the disconnect event goes first (sent reliably, in order)
        await self.remove_participant(identity, why)

    async def remove_participant(self, identity: str, why: str) -> bool:
        """Remove a participant from the room through LiveKit's room service (RoomService.RemoveParticipant,
        with a token granting roomAdmin on this room). Returns whether the service accepted it."""
        from livekit import api

        self.removed.append((identity, why))
        try:
            async with api.LiveKitAPI(self.config.http_url, self.config.api_key, self.config.api_secret) as lk:
                await lk.room.remove_participant(api.RoomParticipantIdentity(room=self.room_name, identity=identity))
        except Exception as e:  # noqa: BLE001 - already gone, or the service unreachable: logged, not fatal
            logger.info("%r: could not remove %s (%s): %r", self, identity, why, e)
            return False
        logger.info("%r: removed %s from the room (%s)", self, identity, why)
        return True

    def remove_viewer(self, identity: str, reason: str) -> None:
        """A viewer's token was revoked or ran out: remove its participant from the room (if it joined)."""
        if not self.conn.closing:
            self._spawn(self.remove_participant(identity, f"viewer {reason}"))

    def _drop(self, reason: str, what: str) -> None:
        self.dropped[reason] += 1
        n = self.dropped[reason]
        if n <= 10 or n % 1000 == 0:  # bounded logging under a flood
            logger.info("%r: dropped %s (%d dropped for this reason)", self, what, n)

    def send_event(self, event: dict[str, Any], *, topic: str = EVENTS_TOPIC,
                   valid: Callable[[], bool] | None = None) -> None:
        """Send a server event to the user on `topic`, reliably (if the user is known and we are connected).

        Args:
            valid: frame metadata: checked right before the packet goes to the SDK, which sends it in
                order with RPC replies, so metadata of a frame made stale by a flush never follows the
                flush reply; also dropped when MAX_FRAME_SENDS sends are in flight.
        """
        if self.conn.closing or self.user_identity is None or not self.room.isconnected():
            return
        if valid is not None and len(self.conn.tasks) >= MAX_FRAME_SENDS:
            self.frame_events_dropped += 1
            return
        self._spawn(self._send(json.dumps(event, separators=(",", ":")), topic, [self.user_identity], valid))

    async def _send(self, payload: str, topic: str, to: list[str], valid: Callable[[], bool] | None) -> None:
        if valid is not None and not valid():
            self.frame_events_dropped += 1
            return
        # publish_data hands the packet to the native library before its first await
        await self.room.local_participant.publish_data(payload, reliable=True, destination_identities=to, topic=topic)

    def _on_published(self, frame: VideoFrame) -> None:
        self.send_event(frame_event(frame, self.session.clock()), topic=FRAMES_TOPIC,
                        valid=lambda: self.session.frames.is_current(frame))

    def _spawn(self, coro: Any) -> None:
        self.conn.spawn(coro)

    # -- teardown -----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Leave the room and detach from the session (idempotent; the core's close, then `_leave`)."""
        await self.conn.aclose(sink=self.sink, after=self._leave)

    async def _leave(self) -> None:
        await self.sink.aclose()
        try:
            await asyncio.wait_for(self.room.disconnect(), 10.0)
        except Exception as e:  # noqa: BLE001 - leaving is best effort
            logger.info("%r: disconnect failed: %r", self, e)
        logger.info("%r: left", self)


class LiveKitWorlds:
    """Every LiveKit world of one server, by session id.

    A world whose user leaves closes its session (`CloseReason.CLIENT`), which frees the slot.
    """

    def __init__(self, config: LiveKitConfig, manager: SessionManager, *, video_scale: int = 1,
                 make_guard: Callable[[], InputGuard] = InputGuard) -> None:
        self.config = config
        self.manager = manager
        self.video_scale = video_scale
        self.make_guard = make_guard  #: each world's `InputGuard` (the server's limits and metrics hook)
        self.worlds: dict[str, LiveKitWorld] = {}
        #: called with (world, session) whenever a world's session ends (used by the agent worker)
        self.on_ended: Callable[[LiveKitWorld], None] | None = None

    async def open(self, session: Session, *, room: str, user_identity: str | None,
                   url: str | None = None, token: str | None = None,
                   before_join: Callable[[], Awaitable[None]] | None = None) -> LiveKitWorld:
        """Join `room` as the session's world.

        Args:
            before_join: awaited after the world is registered (it holds the room from then on) and before
                it joins; what it raises comes out of `open`, with nothing of the world left.

        Raises:
            LiveKitJoinError: joining failed (the world left; the session is left open: the caller closes it).
            Exception: anything else that failed (the same: nothing of the world is left, the caller
                closes the session).
        """
        world = LiveKitWorld(session, room_name=room, user_identity=user_identity, config=self.config,
                             video_scale=self.video_scale,
                             on_user_left=self._user_left, guard=self.make_guard())
        self.worlds[session.id] = world
        try:
            if before_join is not None:
                await before_join()
            await world.join(url, token)
        except BaseException:
            self.worlds.pop(session.id, None)
            await world.aclose()
            raise
        session.on("state", lambda s, st: self._forget(s) if st == SessionState.CLOSED else None)
        return world

    def owner_of(self, room: str) -> str | None:
        """The id of the session whose world is in (or joining) `room`, if any (read from the worlds)."""
        return next((sid for sid, w in self.worlds.items() if w.room_name == room), None)

    async def room_exists(self, room: str) -> bool:
        """Whether `room` exists on the LiveKit server (RoomService.ListRooms by name).

        Raises:
            LiveKitJoinError: the room service did not answer (nothing can be decided without it).
        """
        from livekit import api

        try:
            async with api.LiveKitAPI(self.config.http_url, self.config.api_key, self.config.api_secret) as lk:
                rooms = await asyncio.wait_for(lk.room.list_rooms(api.ListRoomsRequest(names=[room])),
                                               self.config.join_timeout_s)
        except Exception as e:  # noqa: BLE001 - unreachable, refused, timed out: said, not guessed
            raise LiveKitJoinError(f"could not ask the LiveKit room service at {self.config.http_url} whether "
                                   f"room {room!r} exists: {type(e).__name__}: {e}") from None
        return any(r.name == room for r in rooms.rooms)

    async def serve(self, session: Session, *, room: str | None, operator: bool = False) -> LiveKitAccess:
        """Join a room as the world of a session created over HTTP; the user gets a token of their own.

        A room belongs to its session (issue 31): a caller naming a room may not take one that another
        session's world is in or that already exists on the LiveKit server (someone else's call), unless
        it is the operator. Without a name the server names a fresh room (`server_room_name`). The claim
        is the world's entry in `worlds`, made before anything is awaited, so two creates naming the same
        room cannot both pass.

        Args:
            room: the room the caller named, or None.
            operator: the caller gave the operator credential (the admin token): it may join any room.

        Returns:
            how the user joins: URL, room, identity `user-<session id>` and its token.

        Raises:
            LiveKitRoomTaken: the named room is another session's, or exists on the LiveKit server.
            LiveKitJoinError: joining failed, or the room service could not be asked (the session is left
                open; the caller closes it).
        """
        named = room is not None
        room = room if room is not None else server_room_name()
        owner = self.owner_of(room)
        if named and not operator and owner is not None:
            raise LiveKitRoomTaken(f"room {room!r} belongs to another session; name no room (the server names "
                                   "one) or another room")
        identity = user_identity(session.id)
        check = None
        if named and not operator:
            async def check() -> None:
                if await self.room_exists(room):
                    raise LiveKitRoomTaken(f"room {room!r} already exists on the LiveKit server; a session only "
                                           "joins a room of its own (name no room, or a new one; an operator "
                                           "may join an existing room with the admin token)")
        world = await self.open(session, room=room, user_identity=identity, before_join=check)
        issued = time.time()
        world.join_deadline_s = issued + self.config.user_token_ttl_s
        return LiveKitAccess(url=self.config.ws_url, room=room, identity=identity,
                             token=user_token(self.config, room=room, identity=identity, issued_at_s=issued),
                             token_ttl_s=self.config.user_token_ttl_s, world_identity=world.identity)

    def viewer_access(self, session: Session, viewer: Viewer) -> LiveKitAccess | None:
        """Subscribe-only access to the session's room for one of its viewers (None: the session is not served in
        a room). Its token lets the viewer join hidden and subscribe, for at most `user_token_ttl_s` and never past
        the viewer token's own end; when the viewer token is revoked or runs out, its participant is removed.

        Raises:
            ValueError: the viewer token has under a second left.
        """
        world = self.worlds.get(session.id)
        if world is None:
            return None
        identity = viewer_identity(session.id, viewer.viewer_id)
        ttl_s = min(self.config.user_token_ttl_s, viewer.expires_at_s - session.clock())
        token = viewer_token(self.config, room=world.room_name, identity=identity, ttl_s=ttl_s)
        viewer.on_revoke.append(lambda reason: world.remove_viewer(identity, reason))
        return LiveKitAccess(url=self.config.ws_url, room=world.room_name, identity=identity, token=token,
                             token_ttl_s=round(ttl_s, 3), world_identity=world.identity)

    def _user_left(self, world: LiveKitWorld) -> None:
        self.manager.close(world.session.id, CloseReason.CLIENT)

    def _forget(self, session: Session) -> None:
        world = self.worlds.pop(session.id, None)
        if world is not None and self.on_ended is not None:
            self.on_ended(world)

    async def aclose(self) -> None:
        """Every world leaves its room."""
        for w in list(self.worlds.values()):
            await w.aclose()
        self.worlds.clear()
