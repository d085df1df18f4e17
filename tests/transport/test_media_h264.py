"""The one realtime H.264 configuration (`transport/media/h264.py`), checked on libx264's own output."""

import av
import numpy as np
import pytest

from worldcast.transport.media import h264
from worldcast.transport.media.picture import yuv420p

SIDE = 64


def _nal_types(annexb: bytes) -> list[int]:
    """NAL unit types of an Annex-B access unit (start codes 00 00 01 / 00 00 00 01)."""
    out, i = [], annexb.find(b"\x00\x00\x01")
    while i >= 0:
        out.append(annexb[i + 3] & 0x1F)
        i = annexb.find(b"\x00\x00\x01", i + 3)
    return out


def _encode(n: int, *, force: frozenset[int] = frozenset(), global_header: bool = False,
            **kw: object) -> list[list[av.Packet]]:
    cc = av.CodecContext.create("libx264", "w")
    if global_header:  # as a muxer opens it (the fMP4 stream's mp4 muxer): SPS/PPS go to extradata
        cc.flags |= av.codec.context.Flags.global_header
    h264.configure(cc, width=SIDE, height=SIDE, fps=20, **kw)  # type: ignore[arg-type]
    out = []
    rng = np.random.default_rng(0)
    for i in range(n):
        vf = yuv420p(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8))
        vf.pts = i
        if i in force:
            vf.pict_type = av.video.frame.PictureType.I
        out.append(list(cc.encode(vf)))
    return out


def test_one_packet_per_picture_an_idr_each_second_and_on_request() -> None:
    """zerolatency: every picture comes out as one packet at once (no encoder delay); IDRs at 0, where the
    caller marks a picture I (7), and then a second (20 pictures at 20 fps) after the last one."""
    packets = _encode(45, force=frozenset({7}), crf=23)
    assert [len(p) for p in packets] == [1] * 45
    keys = [i for i, p in enumerate(packets) if p[0].is_keyframe]
    assert keys == [0, 7, 27]
    assert all(5 in _nal_types(bytes(packets[i][0])) for i in keys)  # IDR slices, not open-GOP I pictures


def test_headers_repeat_before_every_keyframe_when_asked_even_under_a_muxer() -> None:
    """repeat_headers (LiveKit: a subscriber may start at any keyframe, no init segment) puts SPS (7) before every
    IDR even where the context keeps headers out of band (a muxer's global header); without it, under a muxer,
    they live only in the extradata (the fMP4 stream's avcC)."""
    def keyframes_with_sps(**kw: object) -> list[bool]:
        return [7 in _nal_types(bytes(p[0])) for p in _encode(25, global_header=True, **kw) if p[0].is_keyframe]

    assert keyframes_with_sps(bitrate_bps=500_000, repeat_headers=True) == [True, True]
    assert keyframes_with_sps(crf=23) == [False, False]


@pytest.mark.parametrize("kw, match", [
    ({"width": 63, "crf": 23}, "even, positive"),
    ({"width": 0, "crf": 23}, "even, positive"),
    ({"fps": 0, "crf": 23}, "fps must be positive"),
    ({"crf": 23, "bitrate_bps": 10**6}, "exactly one"),
    ({}, "exactly one"),
])
def test_bad_settings_are_refused_before_the_codec_is_touched(kw: dict[str, object], match: str) -> None:
    """A size x264 cannot take, no frame rate, or no single rate control: a ValueError naming it, the context unset."""
    cc = av.CodecContext.create("libx264", "w")
    args = {"width": SIDE, "height": SIDE, "fps": 20} | kw
    with pytest.raises(ValueError, match=match):
        h264.configure(cc, **args)  # type: ignore[arg-type]
    assert cc.width == 0  # nothing set
