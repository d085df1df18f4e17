"""fMP4: the box writer, the encoder's init segment and codec string, PyAV reading our stream, the sink."""

from __future__ import annotations

import asyncio
import io
import struct
import time
from fractions import Fraction

import av
import numpy as np
import pytest

from worldcast.sessions.frames import FramePipeline, VideoFrame
from worldcast.transport.errors import BoxError
from worldcast.transport.media import picture
from worldcast.transport.media.stamp import read_stamp
from worldcast.transport.stream import mp4box
from worldcast.transport.stream.fmp4 import EncodedSample, Fmp4Encoder, Fmp4Fragmenter, Fmp4Sink

FPS = 20
SIDE = 256


def image(i: int, side: int = SIDE) -> np.ndarray:
    """A moving gradient with some texture (so P-frames are not empty)."""
    y, x = np.mgrid[0:side, 0:side]
    r = ((x + 3 * i) % 256).astype(np.uint8)
    g = ((y * 2 + i) % 256).astype(np.uint8)
    b = (((x ^ y) + 5 * i) % 256).astype(np.uint8)
    return np.stack([r, g, b], -1)


def frame(i: int, *, epoch: int = 0, side: int = 64) -> VideoFrame:
    return VideoFrame(image=image(i, side), pts=i * 4500, time_base=Fraction(1, 90000), frame_index=i,
                      action_seq=i - 1, epoch=epoch, present_at_s=100.0 + i / FPS)


def yuv(i: int) -> av.VideoFrame:
    return av.VideoFrame.from_ndarray(image(i), format="rgb24").reformat(format="yuv420p")


def encode_stream(n: int, keyframes_at: set[int] = frozenset()) -> tuple[Fmp4Encoder, list[bytes], list[bool]]:  # type: ignore[assignment]
    enc = Fmp4Encoder(width=SIDE, height=SIDE, fps=FPS, gop_frames=1000)
    frag = Fmp4Fragmenter.from_encoder(enc)
    out, keys = [], []
    for i in range(n):
        (s,) = enc.encode(yuv(i), keyframe=i in keyframes_at)
        out.append(frag.fragment(s))
        keys.append(s.keyframe)
    enc.close()
    return enc, out, keys


# -- boxes ---------------------------------------------------------------------------------------------


def test_media_segment_round_trips_and_points_into_its_mdat() -> None:
    samples = [mp4box.Sample(b"\x00\x00\x00\x02\x65\x88", 4500, True), mp4box.Sample(b"\x00\x00\x00\x01\x41", 4500,
                                                                                       False)]
    data = mp4box.media_segment(sequence_number=7, track_id=1, base_decode_time=2**33, samples=samples)
    kinds = [b.kind for b in mp4box.iter_boxes(data)]
    assert kinds == [b"moof", b"mdat"]
    seg = mp4box.parse_media_segment(data)
    assert (seg.sequence_number, seg.base_decode_time) == (7, 2**33)
    assert seg.samples == samples
    mdat = list(mp4box.iter_boxes(data))[1]
    assert data[mdat.payload_offset:mdat.end] == b"".join(s.data for s in samples)
    tfhd = mp4box.find_box(data, [b"moof", b"traf", b"tfhd"])
    assert tfhd is not None
    assert struct.unpack_from(">I", data, tfhd.payload_offset)[0] & 0xFFFFFF == mp4box.TFHD_DEFAULT_BASE_IS_MOOF


def test_box_reader_rejects_truncated_and_oversized_boxes() -> None:
    good = mp4box.box(b"free", b"abcd")
    with pytest.raises(BoxError, match="past the end"):
        list(mp4box.iter_boxes(good[:-1]))
    with pytest.raises(BoxError, match="truncated"):
        list(mp4box.iter_boxes(good + b"\x00\x00"))
    with pytest.raises(ValueError, match="at least one sample"):
        mp4box.media_segment(sequence_number=1, track_id=1, base_decode_time=0, samples=[])
    with pytest.raises(BoxError, match="moof"):
        mp4box.parse_media_segment(good)


def test_annexb_to_length_prefixed_drops_parameter_sets() -> None:
    sps, pps, idr = b"\x67\x42\xc0\x0c\xaa", b"\x68\xce\x0f", b"\x65\x88\x84\x00\x01"
    annexb = b"\x00\x00\x00\x01" + sps + b"\x00\x00\x01" + pps + b"\x00\x00\x00\x01" + idr + b"\x00"
    assert mp4box.split_annexb(annexb) == [sps, pps, idr]
    avcc = mp4box.annexb_to_avcc(annexb)
    assert avcc == struct.pack(">I", len(idr)) + idr
    assert mp4box.avcc_nal_types(avcc) == [mp4box.NAL_IDR]
    assert mp4box.avc_codec_string(sps) == "avc1.42C00C"
    with pytest.raises(ValueError, match="SPS"):
        mp4box.avc_codec_string(pps)


# -- encoder -------------------------------------------------------------------------------------------


def test_init_segment_is_live_and_its_codec_string_is_the_sps() -> None:
    enc = Fmp4Encoder(width=SIDE, height=SIDE, fps=FPS)
    info = mp4box.parse_init(enc.init_segment)
    assert info.movie_duration == 0 and not info.has_mehd, "a live stream declares no duration"
    assert (info.width, info.height, info.timescale) == (SIDE, SIDE, 90_000)
    assert enc.frame_duration == 4500
    # read the SPS back with an independent reader: PyAV's demuxer hands us the avcC as extradata
    with av.open(io.BytesIO(enc.init_segment + encode_stream(1)[1][0])) as c:
        extradata = c.streams.video[0].codec_context.extradata
        profile = c.streams.video[0].codec_context.profile
    assert extradata[0] == 1  # AVCDecoderConfigurationRecord
    assert enc.codec == "avc1." + extradata[1:4].hex().upper()
    assert enc.codec.startswith("avc1.42C"), "ultrafast x264 emits Constrained Baseline"
    assert profile == "Constrained Baseline"
    assert enc.mime == f'video/mp4; codecs="{enc.codec}"'
    enc.close()


def test_concatenated_stream_decodes_with_pyav_to_every_frame_in_order() -> None:
    n = 45
    enc, frags, keys = encode_stream(n, keyframes_at={17, 30})
    assert keys[0] and keys[17] and keys[30] and sum(keys) == 3  # IDR first and where asked, nowhere else
    with av.open(io.BytesIO(enc.init_segment + b"".join(frags))) as c:
        st = c.streams.video[0]
        assert st.time_base == Fraction(1, 90_000)
        pkts = [p for p in c.demux(st) if p.size]
        decoded = [f for p in pkts for f in p.decode()]
    assert len(pkts) == n
    assert [p.is_keyframe for p in pkts] == keys
    pts = [f.pts for f in decoded]
    assert len(decoded) == n and pts == sorted(set(pts)), "strictly increasing timestamps"
    assert pts == [i * 4500 for i in range(n)], "gapless: one frame period per fragment"
    # and the pictures are the ones we encoded (lossy: compare coarsely)
    err = np.abs(decoded[25].to_ndarray(format="rgb24").astype(int) - image(25).astype(int)).mean()
    assert err < 12, err


def test_each_fragment_is_ready_at_once_while_ffmpegs_muxer_holds_it_a_frame() -> None:
    """Why mp4box writes the fragments: FFmpeg closes a fragment only when the next packet arrives."""
    buf = io.BytesIO()
    c = av.open(buf, "w", format="mp4", options={"movflags": "empty_moov+default_base_moof+frag_every_frame"})
    st = c.add_stream("libx264", rate=FPS)
    st.width = st.height = SIDE
    st.pix_fmt = "yuv420p"
    st.codec_context.options = {"preset": "ultrafast", "tune": "zerolatency"}
    held = []
    for i in range(6):
        f = yuv(i)
        f.pts = i
        for p in st.encode(f):
            c.mux(p)
        moofs = sum(b.kind == b"moof" for b in mp4box.iter_boxes(buf.getvalue()))
        held.append(i + 1 - moofs)
    c.close()
    assert held == [1] * 6, f"FFmpeg's muxer held {held} frames after each packet"
    enc = Fmp4Encoder(width=SIDE, height=SIDE, fps=FPS)
    frag = Fmp4Fragmenter.from_encoder(enc)
    for i in range(3):
        (s,) = enc.encode(yuv(i))  # one packet out per frame in: nothing held in the encoder either
        assert mp4box.parse_media_segment(frag.fragment(s)).sequence_number == i + 1
    enc.close()


def test_fragmenter_refuses_to_start_a_stream_on_a_p_frame() -> None:
    frag = Fmp4Fragmenter(track_id=1, frame_duration=4500)
    with pytest.raises(ValueError, match="keyframe"):
        frag.fragment(EncodedSample(b"\x00\x00\x00\x01\x41", keyframe=False, encode_ms=0.0))


def test_encoder_rejects_odd_sizes() -> None:
    with pytest.raises(ValueError, match="even"):
        Fmp4Encoder(width=255, height=256, fps=FPS)


def test_stamped_pictures_survive_h264_in_fmp4() -> None:
    enc = Fmp4Encoder(width=SIDE, height=SIDE, fps=FPS)
    frag = Fmp4Fragmenter.from_encoder(enc)
    data = enc.init_segment
    for i in range(5):
        (s,) = enc.encode(picture.yuv420p(picture.prepare(frame(i), scale=4, stamp=True)))
        data += frag.fragment(s)
    enc.close()
    with av.open(io.BytesIO(data)) as c:
        luma = [f.to_ndarray(format="gray") for f in c.decode(video=0)]
    stamps = [read_stamp(y) for y in luma]
    assert [(s.frame_index, s.action_seq) for s in stamps if s] == [(i, i - 1) for i in range(5)]


# -- sink ----------------------------------------------------------------------------------------------


async def test_sink_holds_at_most_two_frames_encodes_off_the_loop_and_keys_after_clear() -> None:
    epoch = [0]
    got: list[tuple[VideoFrame, EncodedSample]] = []
    arrived = asyncio.Event()

    def on_sample(f: VideoFrame, enc: Fmp4Encoder, s: EncodedSample) -> None:
        got.append((f, s))
        arrived.set()

    pipeline = FramePipeline(current_epoch=lambda: epoch[0], send_ahead_s=0.0, clock=time.monotonic)
    sink = Fmp4Sink(pipeline, fps=FPS, on_sample=on_sample, scale=4, name="t")
    enc = sink.encode
    sink.start()
    for i in range(10):  # a burst: put never blocks, the sink keeps the newest two
        sink.put(frame(i))
    assert len(enc.queue) <= 2
    while enc.frames_encoded + enc.queue.frames_dropped < 10:
        arrived.clear()
        await asyncio.wait_for(arrived.wait(), 10)
    assert got[0][1].keyframe and got[-1][0].frame_index == 9
    assert enc.queue.frames_dropped >= 7 and len(got) + enc.queue.frames_dropped == 10

    epoch[0] = 1  # a flush: queued frames go, stale ones are not handed on, the next is an IDR
    sink.put(frame(10))
    sink.clear()
    n = len(got)
    sink.put(frame(11, epoch=0))  # generated before the flush, delivered late: dropped after encoding
    sink.put(frame(12, epoch=1))
    while len(got) == n:
        arrived.clear()
        await asyncio.wait_for(arrived.wait(), 10)
    f, s = got[n]
    assert f.frame_index == 12 and s.keyframe
    assert enc.encoder is not None and enc.encoder.width == 256
    await sink.aclose()
    await sink.aclose()  # idempotent
    assert pipeline.shared == {}, "the last sink to leave ended the encode"
    sink.put(frame(13))  # ignored once closed
    assert sink.frames_in == 13


async def test_streams_of_one_session_share_one_encode_and_a_late_one_starts_at_an_idr() -> None:
    """Two sinks of one session: one encoder, one encode per frame (a frame handed on by both is queued once),
    every sample told to both; a sink that joins a running encode gets an IDR next; the encode ends with the
    last sink."""
    pipeline = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.0, clock=time.monotonic)
    got: dict[str, list[tuple[int, bool]]] = {"a": [], "b": []}
    arrived = asyncio.Event()

    def on_sample(name: str):  # type: ignore[no-untyped-def]
        def cb(f: VideoFrame, enc: Fmp4Encoder, s: EncodedSample) -> None:
            got[name].append((f.frame_index, s.keyframe))
            arrived.set()
        return cb

    a = Fmp4Sink(pipeline, fps=FPS, on_sample=on_sample("a"), scale=2, name="a")
    a.start()

    async def wait_for(name: str, n: int) -> None:
        while len(got[name]) < n:
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 10)

    for i in range(3):
        a.put(frame(i))
        await wait_for("a", i + 1)
    b = Fmp4Sink(pipeline, fps=FPS, on_sample=on_sample("b"), scale=2, name="b")
    b.start()
    assert b.encode is a.encode and len(pipeline.shared) == 1
    drops: list[tuple[str, int]] = []
    b.on_drop = lambda why, n: drops.append((why, n))
    b.put(frame(2))  # the session's last frame, handed to a sink that attaches: the encode is past it
    assert drops == [("stale", 1)]
    for i in range(3, 5):
        a.put(frame(i))
        b.put(frame(i))  # the same frame from the second sink: queued once
        await wait_for("b", i - 2)
    assert a.encode.frames_encoded == 5 and a.encode.frames_in == 5
    assert got["a"] == [(0, True), (1, False), (2, False), (3, True), (4, False)]
    assert got["b"] == [(3, True), (4, False)], "the late sink starts at an IDR"
    await a.aclose()
    assert not b.encode._closed and len(pipeline.shared) == 1, "the encode lives while a sink reads it"
    await b.aclose()
    assert pipeline.shared == {} and b.encode._closed



def test_avcc_samples_go_back_to_annexb_with_the_encoders_parameter_sets_first() -> None:
    enc, _, _ = encode_stream(0)
    assert [u[0] & 0x1F for u in enc.parameter_sets] == [mp4box.NAL_SPS, mp4box.NAL_PPS]
    assert enc.codec == mp4box.avc_codec_string(enc.parameter_sets[0])
    sample = b"\x00\x00\x00\x02\x65\x88\x00\x00\x00\x01\x06"
    annexb = mp4box.avcc_to_annexb(sample, before=enc.parameter_sets)
    assert mp4box.split_annexb(annexb) == [*enc.parameter_sets, b"\x65\x88", b"\x06"]
    assert mp4box.annexb_to_avcc(annexb) == sample, "parameter sets dropped again, the rest round-trips"
    for bad in (b"\x00\x00\x00", b"\x00\x00\x00\x05\x65"):
        with pytest.raises(BoxError):
            mp4box.avcc_to_annexb(bad)
    info = mp4box.parse_init(enc.init_segment)
    assert info.avcc is not None
    for cut in (6, 9, len(info.avcc) - 1):
        with pytest.raises(BoxError):
            mp4box.parameter_sets_from_avcc(info.avcc[:cut])
    with pytest.raises(BoxError):
        mp4box.parameter_sets_from_avcc(b"\x02" + info.avcc[1:])
