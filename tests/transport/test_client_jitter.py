"""MarkerJitterBuffer: a video frame is released at its last packet, as browsers do."""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from worldcast.transport.clients.webrtc import MarkerJitterBuffer


def pkt(seq: int, ts: int, data: bytes, marker: bool = False) -> RtpPacket:
    p = RtpPacket(payload_type=96, sequence_number=seq, timestamp=ts, marker=int(marker))
    p._data = data  # type: ignore[attr-defined]  (depayloaded bytes, as the receiver sets them)
    return p


def test_frame_is_released_at_the_marker_packet_not_one_frame_later() -> None:
    ours, aiortc = MarkerJitterBuffer(capacity=128, is_video=True), JitterBuffer(capacity=128, is_video=True)
    frame1 = [pkt(10, 3000, b"a"), pkt(11, 3000, b"b"), pkt(12, 3000, b"c", marker=True)]
    out_ours = [ours.add(p)[1] for p in frame1]
    out_aiortc = [aiortc.add(p)[1] for p in frame1]
    assert out_ours[:2] == [None, None] and out_ours[2] is not None
    assert (out_ours[2].data, out_ours[2].timestamp) == (b"abc", 3000)
    assert out_aiortc == [None, None, None]  # aiortc waits for the next frame's first packet
    # the next frame: one packet with the marker is a whole frame
    f2 = ours.add(pkt(13, 7500, b"d", marker=True))[1]
    assert f2 is not None and (f2.data, f2.timestamp) == (b"d", 7500)


def test_a_lost_packet_holds_the_frame_until_it_arrives_out_of_order() -> None:
    jb = MarkerJitterBuffer(capacity=128, is_video=True)
    assert jb.add(pkt(20, 100, b"x"))[1] is None
    assert jb.add(pkt(22, 100, b"z", marker=True))[1] is None  # 21 missing: not complete
    late = jb.add(pkt(21, 100, b"y"))[1]
    assert late is not None and late.data == b"xyz"


def test_without_a_marker_it_falls_back_to_the_timestamp_rule() -> None:
    jb = MarkerJitterBuffer(capacity=128, is_video=True)
    assert jb.add(pkt(30, 100, b"p"))[1] is None
    assert jb.add(pkt(31, 100, b"q"))[1] is None
    f = jb.add(pkt(32, 200, b"r"))[1]  # a new timestamp completes the previous frame
    assert f is not None and (f.data, f.timestamp) == (b"pq", 100)
