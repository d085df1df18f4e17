"""A recording's video: the session's one H.264 encode written to `video.mp4` beside its event log.

`RecordingVideo` is one more `Fmp4Sink` of the session's `SessionEncode`
(`transport/stream/fmp4.py`): the fMP4 streams and spectators of the session
share the encode with it, and a session without them gets the one encode the
recording starts. The file is fragmented MP4 (ISO/IEC 14496-12 8.8): the init
segment (ftyp, moov) first, then one moof + mdat per frame with gapless decode
times, so it plays at any point of its writing (the moov is written first) and
a server stopped mid-recording leaves a file that plays up to its last whole
fragment. Attached as a spectator's sink: it neither holds the session open nor
wakes it (`Session.attach_spectator`).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from pathlib import Path

from worldcast.sessions.frames import VideoFrame
from worldcast.sessions.session import Session
from worldcast.transport.stream.fmp4 import EncodedSample, Fmp4Encoder, Fmp4Fragmenter, Fmp4Sink

logger = logging.getLogger(__name__)

class RecordingVideo:
    """Writes a session's encoded frames to `path` (see the module docstring). Event loop only.

    Args:
        session: the recorded session.
        path: the file (`<recording folder>/video.mp4`).
        scale: integer upscale of the pictures, as the session's streams use (one encode is shared per picture).
        max_bytes: the file's size cap; past it nothing more is written.
        on_stop: called once with the reason when the video stops by itself (its cap, the disk, a new picture
            size): the recording stops with it (`EventLog.fail`), and the session's clients are told.

    Raises:
        OSError: the file cannot be created.
    """

    def __init__(self, session: Session, path: Path, *, scale: int, max_bytes: int,
                 on_stop: Callable[[str], None] | None = None) -> None:
        self.session = session
        self.on_stop = on_stop
        self.path = path
        self.max_bytes = max_bytes
        self.bytes = 0
        self.frames = 0
        self.stopped: str | None = None
        self._file: io.BufferedWriter | None = open(path, "wb")  # noqa: SIM115 - closed by aclose
        self._fragmenter: Fmp4Fragmenter | None = None
        self._encoder: Fmp4Encoder | None = None
        spec = session.model.spec
        self.sink = Fmp4Sink(session.frames, fps=spec.fps, on_sample=self._on_sample, scale=scale,
                             stamp=session.stamp_frames, depth=max(2, spec.frames_per_chunk),
                             name=f"{session.id}-recording")
        session.attach_spectator(self.sink)
        self.sink.start()

    def _write(self, data: bytes) -> bool:
        if self._file is None:
            return False
        if self.bytes + len(data) > self.max_bytes:
            self._stop(f"the video reached its size cap of {self.max_bytes} bytes")
            return False
        try:
            self._file.write(data)
        except OSError as e:
            self._stop(f"the video could not be written: {e.strerror or e}")
            return False
        self.bytes += len(data)
        return True

    def _on_sample(self, frame: VideoFrame, encoder: Fmp4Encoder, sample: EncodedSample) -> None:
        if self._file is None:
            return
        if self._encoder is None:
            if not sample.keyframe:
                return  # joined a running encode: the file starts at its next IDR (asked for on join)
            self._encoder, self._fragmenter = encoder, Fmp4Fragmenter.from_encoder(encoder)
            if not self._write(encoder.init_segment):
                return
        elif encoder is not self._encoder:
            self._stop("the session's picture changed size: one video file holds one geometry")
            return
        assert self._fragmenter is not None
        if self._write(self._fragmenter.fragment(sample)):
            self.frames += 1
            log = self.session.recording
            if log is not None:  # which frame this picture is (replay's PSNR where frames differ)
                log.video(frame.frame_index, frame.epoch, scale=self.sink.encode.scale, stamp=self.sink.encode.stamp)

    def _stop(self, reason: str, *, asked: bool = False) -> None:
        if self.stopped is None:
            self.stopped = reason
            if not asked:
                logger.warning("Session(%s): recording video stopped: %s", self.session.id, reason)
                if self.on_stop is not None:
                    self.on_stop(reason)
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                logger.warning("Session(%s): closing %s failed", self.session.id, self.path)

    async def aclose(self) -> None:
        """Stop: leave the encode and close the file (idempotent); frames still being encoded are not written."""
        self.session.detach_sink(self.sink)
        await self.sink.aclose()
        self._stop("closed", asked=True)
