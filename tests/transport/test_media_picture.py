"""The one picture preparation every sink shares (`transport/media/picture.py`): the WebRTC track, the fMP4
stream and LiveKit publish the same pixels for a frame."""

from fractions import Fraction

import numpy as np
import pytest

from worldcast.sessions.frames import VideoFrame
from worldcast.transport.media import picture
from worldcast.transport.media.stamp import cell_px_for_width, read_stamp


def _frame(seed: int = 0, side: int = 64) -> VideoFrame:
    img = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return VideoFrame(image=img, pts=9000, time_base=Fraction(1, 90000), frame_index=123, action_seq=45, epoch=0,
                      present_at_s=0.0)


def test_upscaling_repeats_each_pixel_and_leaves_the_frame_alone() -> None:
    f = _frame()
    before = f.image.copy()
    out = picture.prepare(f, scale=4, stamp=False)
    assert out.shape == (256, 256, 3) and out.flags["C_CONTIGUOUS"]
    for dy in range(4):
        for dx in range(4):
            assert np.array_equal(out[dy::4, dx::4], f.image)
    assert np.array_equal(f.image, before)
    assert np.array_equal(picture.prepare(f, scale=1, stamp=False), f.image)


def test_a_stamped_picture_reads_back_and_keeps_the_rest() -> None:
    f = _frame(1)
    before = f.image.copy()
    out = picture.prepare(f, scale=4, stamp=True)
    s = read_stamp(out, cell_px=cell_px_for_width(out.shape[1]))
    assert s is not None and (s.frame_index, s.action_seq) == (123, 45)
    band = 2 * cell_px_for_width(out.shape[1])
    assert np.array_equal(out[:-band], picture.prepare(f, scale=4, stamp=False)[:-band])
    assert np.array_equal(f.image, before)


def test_yuv420p_has_the_pictures_size_and_colours() -> None:
    f = _frame(2)
    f.image[:] = (40, 110, 35)  # the meadow's low terrain: one flat colour, inside video range
    img = picture.prepare(f, scale=4, stamp=False)
    vf = picture.yuv420p(img)
    assert (vf.width, vf.height, vf.format.name) == (256, 256, "yuv420p")
    back = vf.to_ndarray(format="rgb24").astype(int)
    assert np.abs(back - img.astype(int)).max() <= 3  # limited-range 8-bit YUV: rounding only


def test_a_bad_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="upscale factor"):
        picture.prepare(_frame(), scale=0, stamp=False)
