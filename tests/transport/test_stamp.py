"""The frame stamp: raw round trips, real VP8/H.264 round trips, rejection of unstamped and corrupted frames."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest

from worldcast.transport.media.stamp import (
    STAMP_BITS,
    STAMP_CELL_PX,
    STAMP_CELLS_PER_ROW,
    Stamp,
    _crc8,
    min_width,
    read_stamp,
    stamp_height,
    write_stamp,
)

SIDE = 256  # the default published video: 64 px frames, video_scale 4


def noise(seed: int, h: int = SIDE, w: int = SIDE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def gradient(h: int = SIDE, w: int = SIDE, shift: int = 0) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([(xx + shift) % 256, yy % 256, (xx + yy + 2 * shift) // 2 % 256], axis=-1).astype(np.uint8)


def test_geometry() -> None:
    assert (STAMP_CELL_PX, STAMP_BITS) == (8, 64)
    assert (stamp_height(), min_width()) == (16, 256)
    assert (stamp_height(4), min_width(4)) == (8, 128)


def test_crc_is_crc8_smbus() -> None:
    assert _crc8(b"123456789") == 0xF4  # the catalogued check value of CRC-8/SMBUS (poly 0x07)


@pytest.mark.parametrize("frame_index,action_seq", [(0, -1), (0, 0), (1, 1), (2**24 - 1, 2**24 - 2),
                                                    (123456, 9_999_999), (0xA5A5A5, 0x5A5A5A)])
@pytest.mark.parametrize("background", ["noise", "gradient", "black", "white"])
def test_round_trip_raw(frame_index: int, action_seq: int, background: str) -> None:
    image = {"noise": noise(7), "gradient": gradient(), "black": np.zeros((SIDE, SIDE, 3), np.uint8),
             "white": np.full((SIDE, SIDE, 3), 255, np.uint8)}[background]
    out = write_stamp(image, frame_index, action_seq)
    assert read_stamp(out) == Stamp(frame_index, action_seq)
    assert read_stamp(out.mean(axis=2).astype(np.uint8)) == Stamp(frame_index, action_seq)  # luma


def test_values_wrap_modulo_2_pow_24() -> None:
    out = write_stamp(gradient(), 2**24 + 5, 2**24 - 1)
    assert read_stamp(out) == Stamp(5, -1)  # action_seq + 1 == 2**24 wraps to 0, i.e. "none"


def test_numpy_integers_are_accepted() -> None:
    assert read_stamp(write_stamp(gradient(), np.int64(12), np.uint32(34))) == Stamp(12, 34)


def test_band_is_bottom_left_and_other_sizes_work() -> None:
    image = noise(1, h=270, w=300)  # not a multiple of the cell
    out = write_stamp(image, 42, 17, cell_px=4)
    assert read_stamp(out, cell_px=4) == Stamp(42, 17)
    changed = np.argwhere((out != image).any(axis=2))
    assert changed[:, 0].min() >= 270 - stamp_height(4) and changed[:, 1].max() < min_width(4)
    assert set(np.unique(out[-stamp_height(4):, : min_width(4)])) <= {0, 255}


def _encode_decode(codec: str, images: list[np.ndarray], *, bit_rate: int) -> list[av.VideoFrame]:
    """Encode RGB images with `codec` configured as aiortc does, and decode them back."""
    enc = av.CodecContext.create(codec, "w")
    enc.width, enc.height, enc.pix_fmt, enc.bit_rate = SIDE, SIDE, "yuv420p", bit_rate
    enc.time_base, enc.framerate = fractions.Fraction(1, 30), 30
    enc.thread_count = 1
    if codec == "libvpx":  # aiortc/codecs/vpx.py Vp8Encoder settings: realtime CBR
        enc.gop_size, enc.qmin, enc.qmax = 3000, 2, 56
        enc.options = {"bufsize": str(bit_rate), "cpu-used": "-6", "deadline": "realtime", "lag-in-frames": "0",
                       "minrate": str(bit_rate), "maxrate": str(bit_rate), "noise-sensitivity": "4",
                       "overshoot-pct": "15", "partitions": "0", "static-thresh": "1", "undershoot-pct": "100"}
    else:  # aiortc/codecs/h264.py H264Encoder settings
        enc.profile = "Baseline"
        enc.options = {"level": "31", "tune": "zerolatency"}
    dec = av.CodecContext.create("vp8" if codec == "libvpx" else "h264", "r")
    decoded: list[av.VideoFrame] = []
    for pts, image in enumerate(images):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = pts
        for packet in enc.encode(frame):
            decoded += dec.decode(packet)
    for packet in enc.encode(None):
        decoded += dec.decode(packet)
    return decoded


@pytest.mark.parametrize("codec,bit_rate", [("libvpx", 250_000), ("libx264", 250_000)])
def test_round_trip_through_real_codec(codec: str, bit_rate: int) -> None:
    """30 frames of noisy moving content at aiortc's lowest VP8 bitrate (250 kbit/s); every stamp survives."""
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV was built without {codec}")
    rng = np.random.default_rng(3)
    expected = [Stamp(i * 1_000_003 % 2**24, i * 7919 - 1) for i in range(30)]
    images = []
    for i, s in enumerate(expected):
        content = gradient(shift=5 * i).astype(np.int16) + rng.normal(0, 60, (SIDE, SIDE, 3)).astype(np.int16)
        images.append(write_stamp(np.clip(content, 0, 255).astype(np.uint8), s.frame_index, s.action_seq))
    decoded = _encode_decode(codec, images, bit_rate=bit_rate)
    assert len(decoded) == len(expected)
    for frame, s in zip(decoded, expected):
        assert read_stamp(frame.to_ndarray(format="rgb24")) == s
        y = frame.to_ndarray(format="gray")
        assert y.shape == (SIDE, SIDE)
        assert read_stamp(y) == s
        plane = frame.planes[0]  # the raw Y plane, video range (16..235), rows padded to line_size
        assert read_stamp(np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]) == s


def test_unstamped_frames_read_as_none() -> None:
    rng = np.random.default_rng(11)
    for seed in range(200):
        assert read_stamp(noise(seed)) is None
        assert read_stamp(np.full((SIDE, SIDE, 3), seed % 256, np.uint8)) is None
        # random full-contrast cells pass the contrast test; sync and CRC must reject them
        cells = rng.integers(0, 2, (2, STAMP_CELLS_PER_ROW), dtype=np.uint8) * np.uint8(255)
        band = np.kron(cells, np.ones((STAMP_CELL_PX, STAMP_CELL_PX), np.uint8))
        assert read_stamp(band) is None
    assert read_stamp(gradient()) is None


def test_any_flipped_cell_reads_as_none() -> None:
    out = write_stamp(gradient(), 0x123456, 0x654321)
    c = STAMP_CELL_PX
    for bit in range(STAMP_BITS):
        bad = out.copy()
        row, col = divmod(bit, STAMP_CELLS_PER_ROW)
        y0 = SIDE - stamp_height() + row * c
        bad[y0 : y0 + c, col * c : (col + 1) * c] ^= 255
        assert read_stamp(bad) is None, f"bit {bit}"


@pytest.mark.parametrize("image,kwargs,match", [
    (np.zeros((SIDE, 255, 3), np.uint8), {}, r"256x255 \(HxW\) is too small .* at least 16x256"),
    (np.zeros((15, SIDE, 3), np.uint8), {}, r"too small"),
    (np.zeros((SIDE, SIDE, 3), np.float32), {}, r"must be uint8 \(H, W, 3\) RGB, got float32"),
    (np.zeros((SIDE, SIDE), np.uint8), {}, r"must be uint8 \(H, W, 3\) RGB, got uint8 \(256, 256\)"),
    (np.zeros((SIDE, SIDE, 4), np.uint8), {}, r"\(256, 256, 4\)"),
    (np.zeros((SIDE, SIDE, 3), np.uint8), {"frame_index": -1}, r"frame_index must be >= 0, got -1"),
    (np.zeros((SIDE, SIDE, 3), np.uint8), {"action_seq": -2}, r"action_seq must be >= -1 .* got -2"),
    (np.zeros((SIDE, SIDE, 3), np.uint8), {"cell_px": 0}, r"cell_px must be >= 1, got 0"),
])
def test_write_rejects_bad_input(image: np.ndarray, kwargs: dict, match: str) -> None:
    args = {"frame_index": 0, "action_seq": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        write_stamp(image, args.pop("frame_index"), args.pop("action_seq"), **args)


def test_write_rejects_non_integer_values() -> None:
    with pytest.raises(TypeError):
        write_stamp(gradient(), 1.5, 0)  # type: ignore[arg-type]


def test_read_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"uint8 \(H, W\) luma or \(H, W, 3\) RGB, got float64"):
        read_stamp(np.zeros((SIDE, SIDE)))
    with pytest.raises(ValueError, match=r"got uint8 \(256, 256, 4\)"):
        read_stamp(np.zeros((SIDE, SIDE, 4), np.uint8))
    with pytest.raises(ValueError, match=r"too small"):
        read_stamp(np.zeros((SIDE, 128), np.uint8))


def test_write_does_not_mutate_input() -> None:
    image = noise(5)
    before = image.copy()
    out = write_stamp(image, 9, 3)
    assert np.array_equal(image, before) and out is not image and not np.shares_memory(out, image)


def test_cell_size_follows_the_picture_width() -> None:
    from worldcast.transport.media.stamp import cell_px_for_width

    assert cell_px_for_width(256) == 8 and cell_px_for_width(1280) == 8
    assert cell_px_for_width(128) == 4 and cell_px_for_width(64) == 2
    with pytest.raises(ValueError, match="at least 32 px wide"):
        cell_px_for_width(31)


def test_non_arrays_and_non_integer_cells_are_rejected_clearly() -> None:
    from worldcast.transport.media.stamp import read_stamp, write_stamp

    for bad in (None, [[0] * 256] * 16):
        with pytest.raises(ValueError, match="numpy array"):
            read_stamp(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="numpy array"):
            write_stamp(bad, 0, 0)  # type: ignore[arg-type]
    img = np.zeros((16, 256, 3), np.uint8)
    for cell in (1.5, "8", None, True):
        with pytest.raises(ValueError, match="cell_px must be an integer"):
            read_stamp(img, cell_px=cell)  # type: ignore[arg-type]
