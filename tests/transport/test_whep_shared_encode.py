"""WHEP peers share the session's one H.264 encode (transport/webrtc/whep.py, encoded_track.py), against a real
server on loopback with real aiortc players that decode the video: two WHEP peers and an fMP4 spectator of a
session cost no encoder beyond the session's one (aiortc's encoders, counted by wrapping the real ones, never
run; one `Fmp4Encoder` is made for the session); a player's RTCP PLI reaches the shared encode; a player that
offers only VP8 gets its own encode."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import av
import httpx
import pytest
from aiortc import RTCRtpReceiver
from aiortc.codecs.h264 import H264Encoder
from aiortc.codecs.vpx import Vp8Encoder

from tests.conftest import LiveServer, _serve, server_config
from tests.transport.test_whep import Player, viewer
from worldcast.sessions.viewers import ViewerConfig
from worldcast.transport.clients import StreamClient
from worldcast.transport.media.stamp import cell_px_for_width, read_stamp
from worldcast.transport.stream import fmp4
from worldcast.transport.stream.fmp4 import SessionEncode
from worldcast.transport.webrtc.whep import answer_video_codec

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(model) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    yield from _serve(server_config(viewers=ViewerConfig(max_spectators_per_session=4, max_spectators=16)), model)


@pytest.fixture
def encoders(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of every encoder in the process (the server runs in it), each the real one, counted."""
    counts = {"h264": 0, "vp8": 0, "fmp4_encoders": 0}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(H264Encoder, "encode", counting("h264", H264Encoder.encode))
    monkeypatch.setattr(Vp8Encoder, "encode", counting("vp8", Vp8Encoder.encode))
    monkeypatch.setattr(fmp4.Fmp4Encoder, "__init__", counting("fmp4_encoders", fmp4.Fmp4Encoder.__init__))
    return counts


def encodes(server: LiveServer, sid: str) -> list[SessionEncode]:
    return [e for e in server.manager.sessions[sid].frames.shared.values() if isinstance(e, SessionEncode)]


def stamped_index(f: av.VideoFrame) -> int | None:
    """The frame index stamped into a decoded picture (`transport/media/stamp.py`), None if unreadable."""
    image = f.to_ndarray(format="rgb24")
    s = read_stamp(image, cell_px=cell_px_for_width(image.shape[1]))
    return None if s is None else s.frame_index


def vp8_only(player: Player) -> Player:
    (t,) = player.pc.getTransceivers()
    t.setCodecPreferences([c for c in RTCRtpReceiver.getCapabilities("video").codecs
                           if c.mimeType in ("video/VP8", "video/rtx")])
    return player


async def test_two_whep_peers_and_an_fmp4_spectator_share_the_sessions_one_encode(
        server: LiveServer, encoders: dict[str, int]) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=11, stamp_frames=True) as c:
        sid = c.session_id
        await c.next_frame()
        v = await viewer(http, sid, c.token)
        players = [Player(), Player()]
        spectator: StreamClient | None = None
        try:
            for p in players:
                r = await p.play(http, v["whep_url"], v["viewer_token"])
                assert r.status_code == 201, r.text
                assert answer_video_codec(r.text) == "video/H264", "the answer sends H.264 first"
            spectator = await StreamClient.attach(server.url, sid, v["viewer_token"])
            got = [await p.frames(10) for p in players]
            for frames in got:  # real video, decoded by aiortc's H.264 decoder
                assert all(f.width == 64 * server.config.video_scale for f in frames)
                assert all(b.pts > a.pts for a, b in zip(frames, frames[1:]))
                # the stamp the shared encode drew (frame index) reads back from every decoded picture and advances
                indices = [stamped_index(f) for f in frames]
                assert None not in indices and all(b > a for a, b in zip(indices, indices[1:])), indices
            await spectator.next_frame()
            peers = list(server.app.state.whep.peers.values())
            assert len(peers) == 2 and all(p.shares_encode for p in peers)
            (encode,) = encodes(server, sid)
            assert len(encode.sinks) == 4, "the controller's stream, the fMP4 spectator and both WHEP peers"
            assert all(p.track.frames_out >= 10 for p in peers)
            assert encoders["fmp4_encoders"] == 1, "one encoder made for the session, and only one"
            assert encoders["h264"] == 0 and encoders["vp8"] == 0, "aiortc encoded nothing: it only packetized"
            # a player's picture loss indication (RTCP PLI, RFC 4585 6.3.1) asks the shared encode for an IDR
            requests = encode.keyframe_requests
            asked = requests.granted + requests.refused
            (t,) = players[0].pc.getTransceivers()
            await t.receiver._send_rtcp_pli(peers[0].transceiver.sender._ssrc)
            for _ in range(100):  # the PLI is handled on the server's loop while frames keep coming
                await players[0].frames(1)
                if requests.granted + requests.refused > asked:
                    break
            assert requests.granted + requests.refused > asked, "the PLI reached the shared encode"
            r = await http.delete(players[1].location, headers={"Authorization": f"Bearer {v['viewer_token']}"})
            await players[1].close()
            assert r.status_code == 200 and len(encode.sinks) == 3, "a leaving peer leaves the encode"
            assert encoders["h264"] == 0 and encoders["fmp4_encoders"] == 1
        finally:
            if spectator is not None:
                await spectator.aclose(delete=False)
            for p in players:
                await p.close()


async def test_a_player_offering_only_vp8_gets_its_own_encode(server: LiveServer, encoders: dict[str, int]) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, \
            await StreamClient.connect(server.url, seed=12, stamp_frames=True) as c:
        sid = c.session_id
        await c.next_frame()
        v = await viewer(http, sid, c.token)
        vp8, h264 = vp8_only(Player()), Player()
        try:
            r = await vp8.play(http, v["whep_url"], v["viewer_token"])
            assert r.status_code == 201 and answer_video_codec(r.text) == "video/VP8", r.text
            assert "H264" not in r.text
            assert (await h264.play(http, v["whep_url"], v["viewer_token"])).status_code == 201
            for p in (vp8, h264):
                frames = await p.frames(5)
                assert all(f.width == 64 * server.config.video_scale for f in frames)
                indices = [stamped_index(f) for f in frames]
                assert None not in indices and all(b > a for a, b in zip(indices, indices[1:])), indices
            by_sharing = {p.shares_encode: p for p in server.app.state.whep.peers.values()}
            assert set(by_sharing) == {False, True}
            (encode,) = encodes(server, sid)
            assert len(encode.sinks) == 2, "the controller's stream and the H.264 peer; the VP8 peer encodes alone"
            assert encoders["vp8"] >= 5 and encoders["h264"] == 0
        finally:
            for p in (vp8, h264):
                await p.close()
