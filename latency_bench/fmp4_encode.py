"""Measure the fMP4 path: encode time per frame, bytes per frame, and FFmpeg's fragment hold.

    python -m worldcast.latency_bench.fmp4_encode --frames 200 --side 256

Prints the time `Fmp4Encoder.encode` takes per picture (yuv420p in, one
length-prefixed sample out), the sizes of IDR and P samples of a moving
test picture, and how many frames FFmpeg's own mp4 muxer (with
`frag_every_frame`) holds after each packet before its fragment appears
(the reason `transport/stream/mp4box.py` writes the fragments).
"""

from __future__ import annotations

import argparse
import io
import time

import av
import numpy as np

from worldcast.transport.media import h264
from worldcast.transport.media.picture import yuv420p
from worldcast.transport.stream.fmp4 import Fmp4Encoder
from worldcast.transport.stream.mp4box import iter_boxes


def picture(i: int, side: int) -> av.VideoFrame:
    y, x = np.mgrid[0:side, 0:side]
    rgb = np.stack([(x + 3 * i) % 256, (2 * y + i) % 256, ((x ^ y) + 5 * i) % 256], -1).astype(np.uint8)
    return yuv420p(rgb)


def ffmpeg_hold(side: int, frames: int = 10) -> list[int]:
    """Frames held by FFmpeg's mp4 muxer after each packet (fragments not yet written)."""
    buf = io.BytesIO()
    c = av.open(buf, "w", format="mp4", options={"movflags": "empty_moov+default_base_moof+frag_every_frame"})
    st = c.add_stream("libx264", rate=20)
    h264.configure(st.codec_context, width=side, height=side, fps=20, crf=23)
    held = []
    for i in range(frames):
        f = picture(i, side)
        f.pts = i
        for p in st.encode(f):
            c.mux(p)
        held.append(i + 1 - sum(b.kind == b"moof" for b in iter_boxes(buf.getvalue())))
    c.close()
    return held


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.fmp4_encode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--side", type=int, default=256, help="picture side, px (even)")
    args = ap.parse_args(argv)
    enc = Fmp4Encoder(width=args.side, height=args.side, fps=20)
    pics = [picture(i, args.side) for i in range(args.frames)]
    ms, idr, p = [], [], []
    for pic in pics:
        t0 = time.perf_counter()
        (s,) = enc.encode(pic)
        ms.append((time.perf_counter() - t0) * 1e3)
        (idr if s.keyframe else p).append(len(s.data))
    enc.close()
    q = np.percentile(ms, [50, 95, 99])
    print(f"{enc.codec} {args.side}x{args.side}: encode ms p50/p95/p99 {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} "
          f"over {args.frames} frames; IDR {np.mean(idr) / 1024:.1f} KiB ({len(idr)}), P {np.mean(p) / 1024:.2f} KiB")
    print(f"FFmpeg mp4 muxer (frag_every_frame): frames held after each packet: {ffmpeg_hold(args.side)}")


if __name__ == "__main__":
    main()
