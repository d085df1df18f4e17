"""The one H.264 configuration every encoded sink uses (libx264 through PyAV).

Realtime settings, the same for the fMP4 stream and LiveKit's pre-encoded track:

- `preset=ultrafast`, `tune=zerolatency`: no lookahead, no B-frames (x264's `--tune zerolatency`),
  so one packet comes out per picture in, at once;
- one encoder thread: small pictures (256x256 takes ~1-2 ms on one core) gain nothing from
  threads but their latency;
- an IDR every `gop_frames` pictures (one second by default) and wherever the caller asks
  (`forced-idr`, a picture marked I): flush, cancel and a viewer that joins late get one at once.

What differs between sinks is explicit: rate control (constant quality `crf` for the fMP4
stream, a bitrate for LiveKit, whose congestion control names one) and whether SPS/PPS repeat
before every keyframe (`repeat_headers`: needed where a subscriber can join at any keyframe and
no init segment carries them, as in LiveKit; the fMP4 stream carries them once in its `avcC`).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

#: Seconds between IDR pictures nobody asked for.
KEYFRAME_INTERVAL_S = 1.0


def gop_frames_for(fps: float) -> int:
    """Pictures between unrequested IDRs at `fps` frames/s: `KEYFRAME_INTERVAL_S` of them, at least 1."""
    return max(1, round(KEYFRAME_INTERVAL_S * fps))


def configure(cc: av.video.codeccontext.VideoCodecContext, *, width: int, height: int, fps: float,
              gop_frames: int | None = None, crf: int | None = None, bitrate_bps: int | None = None,
              repeat_headers: bool = False) -> None:
    """Set a libx264 codec context (not yet opened) to worldcast's realtime configuration (module docstring).

    Args:
        cc: a PyAV libx264 encoder context (`av.CodecContext.create("libx264", "w")` or a muxer stream's).
        width, height: picture size, pixels (even: yuv420p chroma).
        fps: frame rate, frames/s (sets the GOP when `gop_frames` is None).
        gop_frames: pictures between unrequested IDRs; None: `gop_frames_for(fps)`.
        crf: constant rate factor (constant quality); exclusive with `bitrate_bps`.
        bitrate_bps: target bitrate, bits/s; exclusive with `crf`.
        repeat_headers: SPS/PPS before every keyframe.

    Raises:
        ValueError: odd or non-positive size, fps not positive, or both or neither of crf / bitrate_bps.
    """
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"H.264 4:2:0 needs an even, positive picture size, got {width}x{height}")
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if (crf is None) == (bitrate_bps is None):
        raise ValueError("give exactly one of crf (constant quality) and bitrate_bps")
    cc.width, cc.height, cc.pix_fmt = width, height, "yuv420p"
    cc.framerate = Fraction(fps).limit_denominator(1001)
    gop = gop_frames or gop_frames_for(fps)
    cc.gop_size = gop
    cc.max_b_frames = 0
    cc.thread_count = 1
    options = {"preset": "ultrafast", "tune": "zerolatency", "forced-idr": "1"}
    if crf is not None:
        options["crf"] = str(crf)
    else:
        cc.bit_rate = int(bitrate_bps)  # type: ignore[arg-type]
    params = [f"keyint={gop}"]
    if repeat_headers:
        params.append("repeat-headers=1")
    options["x264-params"] = ":".join(params)
    cc.options = options


class FilmWriter:
    """An MP4 film written as its frames come (uint8 (H, W, 3) RGB, one size; odd sizes padded by one edge pixel):
    this configuration at constant quality `crf`, for `worldcast replay --out`, not a realtime stream.

    Raises:
        ValueError (from `add`): a frame of another size than the first.
    """

    def __init__(self, path: str | Path, *, fps: float, crf: int = 18) -> None:
        self.path, self.fps, self.crf = str(path), fps, crf
        self.frames = 0
        self._out: av.container.OutputContainer | None = None
        self._stream: av.video.stream.VideoStream | None = None
        self._size: tuple[int, int] | None = None

    def add(self, img: np.ndarray) -> None:
        h, w = img.shape[:2]
        if self._out is None:
            self._size = (h, w)
            self._out = av.open(self.path, "w", format="mp4")
            self._stream = self._out.add_stream("libx264", rate=Fraction(self.fps).limit_denominator(1001))
            configure(self._stream.codec_context, width=w + w % 2, height=h + h % 2, fps=self.fps, crf=self.crf)
        if (h, w) != self._size:
            raise ValueError(f"a film's frames share one size: {(h, w)} after {self._size}")
        if w % 2 or h % 2:
            img = np.pad(img, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        assert self._stream is not None
        for packet in self._stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")):
            self._out.mux(packet)
        self.frames += 1

    def close(self) -> None:
        """Flush the encoder and write the file's index (idempotent; nothing is written without a frame)."""
        out, self._out = self._out, None
        if out is not None:
            assert self._stream is not None
            for packet in self._stream.encode():
                out.mux(packet)
            out.close()
