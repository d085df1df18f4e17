"""The picture a sink publishes for a frame, prepared one way for every transport.

A model frame (uint8 (h, w, 3) RGB, often small: TinyWorld's is 64x64) is upscaled by an integer
`scale` by pixel repetition (nearest neighbour), so a pixel-art world keeps its crisp pixels and a
frame stamp (`transport/media/stamp.py`, measurement only) keeps its cells' size; then, if asked, the
stamp is drawn into its bottom band. Encoders that take YUV get it as yuv420p (`yuv420p`: PyAV's
libswscale conversion, BT.601 limited range as FFmpeg's default). The WebRTC track (aiortc),
the fMP4 stream and both LiveKit publishers all call these, so every sink shows the same picture, and
`prepare` keeps what it made in the frame (`VideoFrame.derived`), so sinks of one session that ask for
the same picture share one preparation.
"""

from __future__ import annotations

import av
import numpy as np

from worldcast.sessions.frames import VideoFrame
from worldcast.transport.media.stamp import cell_px_for_width, write_stamp


def prepare(frame: VideoFrame, *, scale: int, stamp: bool) -> np.ndarray:
    """The frame's picture: upscaled `scale` times by pixel repetition, stamped if `stamp`; made once per frame
    and (scale, stamp), then shared (read-only) by every sink that asks (any thread: two first callers at once
    may both make it, and one is kept).

    Args:
        frame: the session's frame (image uint8 (h, w, 3) RGB).
        scale: integer upscale factor, >= 1.
        stamp: draw the frame stamp (frame index, last applied action seq) into the bottom band.

    Returns:
        uint8 (h * scale, w * scale, 3) RGB, C-contiguous (a new array where upscaled or stamped; the
        frame's own image otherwise), never to be written: other sinks read the same array.

    Raises:
        ValueError: scale < 1.
    """
    if scale < 1:
        raise ValueError(f"upscale factor must be a positive integer, not {scale}")
    key = ("picture", scale, stamp)
    made = frame.derived.get(key)
    if made is None:
        made = frame.derived.setdefault(key, _prepare(frame, scale, stamp))
    assert isinstance(made, np.ndarray)
    return made


def _prepare(frame: VideoFrame, scale: int, stamp: bool) -> np.ndarray:
    image = frame.image if scale == 1 else frame.image.repeat(scale, 0).repeat(scale, 1)
    if stamp:
        image = write_stamp(image, frame.frame_index, frame.action_seq, cell_px=cell_px_for_width(image.shape[1]))
    return np.ascontiguousarray(image)


def yuv420p(image: np.ndarray) -> av.VideoFrame:
    """uint8 (H, W, 3) RGB -> a yuv420p `av.VideoFrame` (H and W even; no pts set)."""
    return av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
