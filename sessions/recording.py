"""A session's recording: its event log (JSON Lines), enough to see what happened and to generate it again.

A recorded session writes `events.jsonl` in its own folder of the recordings
directory (`--recordings-dir`), one JSON object a line, each with its
`"type"` and `"t"` (seconds since the recording began, the server's monotonic
clock):

- ``header`` (the first line): the format (`FORMAT`), worldcast's version,
  the model (registry name and variant, its `spec.name`), the sha256 of its
  weights as served (`weights_digest`), the device kind, how the engine
  serves (dtype, compiled batch buckets: `ServedWay`), the session's seed,
  mode, prompt and starting image (by content hash: the decoded pixels are
  kept beside the log as `images/<sha256>.png`), the wall-clock start, and
  whether the recording began with the session (`from_start`: only such a
  log can be replayed; `sessions/replay.py`).
- ``action``: every action message the gate accepted: seq, keys, mouse,
  axes, and whether it was the newest or a reordered, stale one.
- ``prompt`` (text and the conditioning version it made), ``flush``,
  ``cancel`` (each with the new epoch), ``pause``, ``resume``, ``state``
  (active, idle, closed).
- ``chunk``: what made a chunk's frames, as the engine reports it with the
  chunk's first frame (`engine/step_output.py` `ChunkRecord`): its first
  latent frame, its noise draws (a chunk begun and dropped draws too), the
  conditioning versions, and its sampled action vectors.
- ``frame``: every frame the engine made: index, epoch, the newest action seq
  it applied, what became of it (delivered with its PTS on the session's
  90 kHz clock, or dropped as stale or by the directing gate) and the sha256
  of its raw RGB pixels (what replay checks itself against).
- ``applied``: the first frame that applied a newer action seq.
- ``stopped`` (the recording stopped: asked, the size cap, a disk error) and
  ``end`` (the session closed, with the reason).

Writing never raises into the session: a full disk or the size cap stops the
recording (`EventLog.stopped` says why, and the owner tells the client), never
the session.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worldcast.engine.step_output import ChunkRecord, FrameOut
from worldcast.sessions.errors import RecordingNotFound, RecordingRefused

logger = logging.getLogger(__name__)

#: The log's format name and version (the header's "format").
FORMAT = "worldcast-events/1"
#: Events written between two flushes to disk at most (a chunk record flushes too).
FLUSH_EVERY = 64


class RecordingError(Exception):
    """A log that cannot be read as a recording: the line and the reason."""


def pixels_sha256(image: np.ndarray) -> str:
    """sha256 (hex) of a uint8 (H, W, 3) RGB frame's raw bytes in C order, with its shape: a frame's identity."""
    h = hashlib.sha256(repr(tuple(image.shape)).encode())
    h.update(np.ascontiguousarray(image).tobytes())
    return h.hexdigest()


def save_image(folder: Path, image: np.ndarray) -> str:
    """Keep a starting image (uint8 (H, W, 3) RGB, decoded) as `images/<sha256>.png` in `folder` (lossless);
    returns the sha256 of its pixels (`pixels_sha256`)."""
    from PIL import Image

    digest = pixels_sha256(image)
    path = folder / "images" / f"{digest}.png"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.ascontiguousarray(image)).save(path, format="PNG")
    return digest


def load_image(folder: Path, digest: str) -> np.ndarray:
    """A starting image kept by `save_image`, checked against its digest.

    Raises:
        RecordingError: missing, or its pixels are not the ones recorded.
    """
    from PIL import Image

    if not _HEX64.match(digest):
        raise RecordingError(f"a starting image is named by 64 hexadecimal digits, not {digest[:80]!r}")
    path = contained_file(folder, "images", f"{digest}.png")
    if path is None:
        raise RecordingError(f"the starting image images/{digest}.png is missing (or not a file of the log's folder)")
    try:
        with Image.open(path) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise RecordingError(f"the starting image {path} has {im.width}x{im.height} pixels, over "
                                     f"{MAX_IMAGE_PIXELS}")
            image = np.asarray(im.convert("RGB"))
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise RecordingError(f"the starting image {path} cannot be read: {e}") from None
    if pixels_sha256(image) != digest:
        raise RecordingError(f"the starting image {path} is not the one recorded (sha256 differs)")
    return image


#: Most pixels a kept starting image may have (4096 x 4096).
MAX_IMAGE_PIXELS = 4096 * 4096
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def contained_file(folder: Path, *parts: str) -> Path | None:
    """`folder / parts...` if it is a regular file inside `folder` reached through no symbolic link, else None.

    A shared log names files only by content inside its own folder (`images/<sha256>.png`, `takes/<sha256>.bin`,
    `snapshot.bin`, `video.mp4`); a name with a separator, `..`, or a link leading out is not one of them, so
    replay never opens a file a log points it to elsewhere.
    """
    if any(not p or p in (".", "..") or "/" in p or "\\" in p or "\0" in p for p in parts):
        return None
    path = folder
    for p in parts:
        path = path / p
        if path.is_symlink():
            return None
    try:
        inside = path.resolve(strict=True).is_relative_to(folder.resolve(strict=True))
    except (OSError, RuntimeError):
        return None
    return path if inside and path.is_file() else None


class EventLog:
    """A session's event log being written (see the module docstring). Event loop only.

    Args:
        path: the `events.jsonl` file (its folder is made).
        header: the header's fields (`"type"`, `"format"` and `"t"` are added).
        max_bytes: the log's size cap; reaching it stops the recording.
        clock: monotonic clock, s.

    Raises:
        OSError: the file cannot be created (nothing is recorded; the caller refuses the recording).
    """

    def __init__(self, path: Path, header: dict[str, Any], *, max_bytes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        self.clock = clock
        self.t0 = clock()
        self.bytes = 0
        self.stopped: str | None = None  #: why the recording stopped (None: recording)
        #: called once when the recording stops by itself (the cap, a disk error) with the reason
        self.on_stop: Callable[[str], None] | None = None
        #: called once when the file is closed, whatever the reason (the store's bookkeeping)
        self.on_closed: Callable[[], None] | None = None
        self._unflushed = 0
        self._applied_seq = -1
        self._video_described = False  #: the first `video` event, which names the picture's scale, is written
        self._file: io.TextIOWrapper | None = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.write("header", format=FORMAT, **header)

    def write(self, kind: str, **fields: Any) -> bool:
        """Append one event; False when the recording has stopped (nothing written)."""
        if self._file is None:
            return False
        line = json.dumps({"type": kind, "t": round(self.clock() - self.t0, 6), **fields},
                          separators=(",", ":"), allow_nan=False) + "\n"
        if self.bytes + len(line) > self.max_bytes:
            self._stop(f"the recording reached its size cap of {self.max_bytes} bytes")
            return False
        try:
            self._file.write(line)
            self._unflushed += 1
            if self._unflushed >= FLUSH_EVERY or kind in ("chunk", "end", "stopped"):
                self._file.flush()
                self._unflushed = 0
        except OSError as e:
            self._stop(f"the recording could not be written: {e.strerror or e}")
            return False
        self.bytes += len(line)
        return True

    # -- what a session tells it ----------------------------------------------------------------------

    def frame(self, out: FrameOut, outcome: str, pts: int | None) -> None:
        """A frame the engine made and what became of it (`FramePipeline`); its chunk record first, if it has one."""
        if out.chunk is not None:
            self.chunk(out.chunk)
        fields: dict[str, Any] = {"index": out.frame_index, "epoch": out.epoch, "action_seq": out.action_seq,
                                  "outcome": outcome, "sha256": None if out.lost else pixels_sha256(out.image)}
        if pts is not None:
            fields["pts"] = pts
        self.write("frame", **fields)
        if outcome == "delivered" and out.action_seq > self._applied_seq:
            self._applied_seq = out.action_seq
            self.write("applied", seq=out.action_seq, frame=out.frame_index)

    def video(self, index: int, epoch: int, *, scale: int, stamp: bool) -> None:
        """Frame `index` (of flush epoch `epoch`) went into `video.mp4` as its next picture, upscaled `scale`
        times by pixel repetition (stamped with its index where `stamp`): which frame each of the film's
        pictures is, so replay can compare a frame it makes otherwise with the one served (PSNR). The first
        such event carries `scale` and `stamp`."""
        extra: dict[str, Any] = {} if self._video_described else {"scale": scale, "stamp": stamp}
        self._video_described = True
        self.write("video", index=index, epoch=epoch, **extra)

    def chunk(self, c: ChunkRecord) -> None:
        extra: dict[str, Any] = {}
        if c.batches is not None and not c.batches.alone:  # left out: every forward ran alone
            b = c.batches
            extra["batches"] = {"previous_commit": list(b.previous_commit),
                                "denoise": [[n, row, lock] for n, row, lock in b.denoise], "decode": list(b.decode)}
        self.write("chunk", first_latent=c.first_latent, draws=c.draws, cached_version=c.cached_version,
                   context_version=c.context_version,
                   actions=None if c.actions is None else [[float(v) for v in row] for row in c.actions], **extra)

    def retake(self, segment: int, state: bytes, epoch: int) -> None:
        """A directing session took segment `segment` again (`sessions/takes.py`): its world was put back to
        `state`, kept beside the log as `takes/<sha256>.bin` (what replay restores), and the new take's frames
        carry flush epochs from `epoch` on. A state that cannot be written stops the recording."""
        if self._file is None:
            return
        digest = hashlib.sha256(state).hexdigest()
        path = self.path.parent / TAKES_DIR / f"{digest}.bin"
        if self.bytes + len(state) > self.max_bytes:
            self._stop(f"the recording reached its size cap of {self.max_bytes} bytes")
            return
        try:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(state)
        except OSError as e:
            self._stop(f"the recording could not be written: {e.strerror or e}")
            return
        self.bytes += len(state)
        self.write("retake", segment=segment, epoch=epoch, state_sha256=digest)

    def stop(self, reason: str) -> None:
        """Stop recording (asked for): an event says so; the file is closed. No `on_stop`: it was asked."""
        self.on_stop = None
        if self._file is not None:
            self.write("stopped", reason=reason)
        self._close(reason)

    def close(self, reason: str) -> None:
        """The session closed: an `end` event, then the file is closed (idempotent)."""
        if self._file is not None:
            self.write("end", reason=reason)
        self._close(reason)

    def fail(self, reason: str) -> None:
        """Stop because a part of the recording failed (its video's cap or disk): as when the log's own cap is
        reached, a `stopped` event is written (if it fits) and `on_stop` is told."""
        if self._file is not None:
            self.write("stopped", reason=reason)
        self._stop(reason)

    def _stop(self, reason: str) -> None:
        if self._file is None:
            return
        logger.warning("recording %s stopped: %s", self.path, reason)
        self._close(reason)
        if self.on_stop is not None:
            self.on_stop(reason)

    def _close(self, reason: str) -> None:
        f, self._file = self._file, None
        if self.stopped is None:
            self.stopped = reason
        if f is not None:
            try:
                f.close()
            except OSError:
                logger.warning("recording %s: closing failed", self.path)
            if self.on_closed is not None:
                self.on_closed()


# -- reading ---------------------------------------------------------------------------------------------

#: Fields each event type must have (beyond "type" and "t"), with their JSON types.
_REQUIRED: dict[str, dict[str, tuple[type, ...]]] = {
    "header": {"format": (str,), "model": (str,), "seed": (int,), "from_start": (bool,)},
    "action": {"seq": (int,), "keys": (list,)},
    "prompt": {"text": (str,), "context_version": (int,)},
    "flush": {"epoch": (int,)},
    "cancel": {"epoch": (int,)},
    "pause": {},
    "resume": {},
    "state": {"state": (str,)},
    "control": {},
    "retake": {"segment": (int,), "epoch": (int,), "state_sha256": (str,)},
    "chunk": {"first_latent": (int,), "draws": (int,), "cached_version": (int,), "context_version": (int,),
              "actions": (list, type(None))},
    "frame": {"index": (int,), "epoch": (int,), "outcome": (str,), "sha256": (str, type(None))},
    "video": {"index": (int,), "epoch": (int,)},
    "applied": {"seq": (int,), "frame": (int,)},
    "stopped": {"reason": (str,)},
    "end": {"reason": (str,)},
}

#: Longest line of a log, characters (the longest a server writes, a chunk record of a long chunk, is far below).
MAX_LINE_CHARS = 1 << 20


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


@dataclass(frozen=True)
class Event:
    """One line of a log: its number (1-based), type and fields."""

    line: int
    type: str
    fields: dict[str, Any]


def read_log(path: Path) -> Iterator[Event]:
    """The events of a log in order, each checked (see `_REQUIRED`); times must not go back.

    Raises:
        RecordingError: "events.jsonl line N: why" for a line that is not UTF-8, longer than `MAX_LINE_CHARS`,
            nested too deeply, not JSON, not an event, of an unknown type,
            missing a field or with one of the wrong type, out of time order, or a first line that is not a
            header of this format.
    """
    last_t = -math.inf
    with open(path, encoding="utf-8", errors="strict") as f:
        for n in itertools.count(1):
            where = f"{path.name} line {n}"
            try:
                raw = f.readline(MAX_LINE_CHARS + 1)
            except UnicodeDecodeError as e:
                raise RecordingError(f"{where}: not UTF-8 ({e.reason})") from None
            if not raw:
                break
            if len(raw) > MAX_LINE_CHARS:
                raise RecordingError(f"{where}: longer than {MAX_LINE_CHARS} characters")
            if not raw.endswith("\n"):
                raise RecordingError(f"{where}: truncated (the line does not end; the log was cut short)")
            try:
                obj = json.loads(raw, parse_constant=_no_constant)
            except json.JSONDecodeError as e:
                raise RecordingError(f"{where}: not JSON ({e.msg})") from None
            except ValueError as e:
                raise RecordingError(f"{where}: {e}") from None
            except RecursionError:
                raise RecordingError(f"{where}: nested too deeply") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
                raise RecordingError(f"{where}: not an event (an object with a \"type\")")
            kind = obj.pop("type")
            want = _REQUIRED.get(kind)
            if want is None:
                raise RecordingError(f"{where}: unknown event type {kind!r}")
            if n == 1 and (kind != "header" or obj.get("format") != FORMAT):
                raise RecordingError(f"{where}: not a {FORMAT} log (its first line must be its header)")
            if n > 1 and kind == "header":
                raise RecordingError(f"{where}: a second header")
            t = obj.get("t")
            if not isinstance(t, int | float) or isinstance(t, bool) or t < last_t:
                raise RecordingError(f"{where}: time {t!r} is not a number at or after the previous line's")
            last_t = t
            for name, types in want.items():
                v = obj.get(name)
                if not isinstance(v, types) or (isinstance(v, bool) and bool not in types) or (
                    name not in obj and type(None) in types):
                    raise RecordingError(f"{where}: {kind} needs {name!r} ({types[0].__name__}), got {v!r}")
            yield Event(n, kind, obj)



def read_events(path: Path) -> list[Event]:
    """Every event of a log (`read_log`), refusing an empty one.

    Raises:
        RecordingError: as `read_log`, or the log has no line.
    """
    events = list(read_log(path))
    if not events:
        raise RecordingError(f"{path.name}: empty (a log begins with its header)")
    return events

# -- the store ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordingConfig:
    """Where recordings go and how much they may take.

    Attributes:
        directory: the recordings directory (`--recordings-dir`); a folder per session.
        max_session_bytes: one recording's size cap (`--recording-max-mib`); reaching it stops the recording.
        max_total_bytes: all kept recordings together (`--recording-quota-mib`); a recording that would start
            beyond it is refused.
        retention_s: a finished recording is kept this long after its session closed, then deleted
            (`--recording-retention`), s.
    """

    directory: Path = Path("recordings")
    max_session_bytes: int = 256 * 2**20
    max_total_bytes: int = 4 * 2**30
    retention_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        if self.max_session_bytes <= 0 or self.max_total_bytes < self.max_session_bytes:
            raise ValueError("recording caps must be positive, the total at least one session's")
        if not 0 < self.retention_s < math.inf:
            raise ValueError(f"the recording retention must be positive and finite, got {self.retention_s!r} s")


#: The file beside a log holding the sha256 of the token that may read it.
TOKEN_FILE = "token.sha256"
#: The recordings directory's lock: the server holding it repairs and deletes what earlier servers left.
LOCK_FILE = ".lock"
#: A recording folder's name: a session id.
_SESSION_ID = re.compile(r"^[0-9a-f]{16}$")
EVENTS_FILE = "events.jsonl"
#: The recording's video beside its log, when the server records video (`Recordings.video`).
VIDEO_FILE = "video.mp4"
#: The folder beside a log holding the states a directing session's retakes put its world back to.
TAKES_DIR = "takes"
#: The state of the snapshot a recorded session started from, beside its log (what replay starts from).
SNAPSHOT_FILE = "snapshot.bin"


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class Recordings:
    """The recordings directory of one server: starts logs, serves finished ones to their session's token for
    `RecordingConfig.retention_s`, deletes them after, and keeps within the quota. Event loop only.

    On construction it looks at what an earlier server left: a log that does not end (that server stopped
    mid-recording) is repaired (a cut last line dropped, an ``end`` event with reason "server_stopped" added)
    and kept for the retention time; one past its retention is deleted. Each is said in the log.

    Args:
        config: where and how much.
        identity: what the header says of the served model beyond the model object ("model": the registry
            "NAME:VARIANT" it was loaded as, "weights": the weights path or None).
        video: starts a recording's video beside its log (the transport's `RecordingVideo`: the session's one
            encode, `video.mp4`), given the session and the file; what it returns is closed (`aclose`) when the
            recording ends. None: logs only.
        clock: monotonic clock, s.
    """

    def __init__(self, config: RecordingConfig, *, identity: dict[str, Any],
                 video: Callable[[Any, Path], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.video = video
        self._videos: dict[str, Any] = {}
        self._closing: set[asyncio.Task[None]] = set()  #: videos being closed (kept from the collector)
        self._lock: Any = None
        self.identity = dict(identity)
        self.clock = clock
        self.live: dict[str, EventLog] = {}
        #: finished recordings kept: session id -> when it finished (clock, s)
        self.kept: dict[str, float] = {}
        config.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    def folder(self, session_id: str) -> Path:
        """A session's recording folder.

        Raises:
            RecordingNotFound: not a session id.
        """
        if not _SESSION_ID.match(session_id):
            raise RecordingNotFound(session_id)
        return self.config.directory / session_id

    def _recover(self) -> None:
        """Repair or delete what an earlier server left. Touches only recording folders (a session id's name,
        holding a token file), and nothing at all while another server holds the directory's lock."""
        import fcntl

        try:
            self._lock = open(self.config.directory / LOCK_FILE, "a+")  # noqa: SIM115 - held for the server's life
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            logger.warning("recordings: another server uses %s: left as it is (no repair, no deletion)",
                           self.config.directory)
            return
        now_wall = time.time()
        for folder in sorted(p for p in self.config.directory.iterdir() if p.is_dir()):
            if not (_SESSION_ID.match(folder.name) and (folder / TOKEN_FILE).exists()):
                continue  # not a recording's folder: never ours to touch
            log = folder / EVENTS_FILE
            age = now_wall - (log.stat().st_mtime if log.exists() else folder.stat().st_mtime)
            if not log.exists() or age > self.config.retention_s:
                _remove(folder)
                logger.info("recordings: deleted %s (%s)", folder,
                            "no event log" if not log.exists() else f"{age:.0f} s old, past the retention")
                continue
            try:
                repaired = repair_log(log)
            except OSError as e:
                logger.warning("recordings: %s could not be repaired (%s): left as it is", log, e)
                continue
            if repaired:
                logger.warning("recordings: repaired %s (its server stopped mid-recording: the log now ends "
                               "with an end event, reason server_stopped)", log)
            self.kept[folder.name] = self.clock() - age

    def used_bytes(self) -> int:
        """Bytes the quota counts: every kept recording's files, and each live recording at its caps (it may grow
        to them)."""
        per_live = self.config.max_session_bytes * (2 if self.video is not None else 1)
        kept = sum(_folder_bytes(p) for p in self.config.directory.iterdir()
                   if p.is_dir() and _SESSION_ID.match(p.name) and p.name not in self.live)
        return kept + per_live * len(self.live)

    def start(self, session: Any, *, served: dict[str, Any] | None, device: str, from_start: bool,
              weights_sha256: str, threads: int | None = None, snapshot: str | None = None,
              snapshot_state: bytes | None = None) -> EventLog:
        """Start recording `session` (a `Session`) into its folder and return its log (the caller attaches it).

        Args:
            served: how its engine serves (dtype, compiled buckets); device: the device kind.
            threads: its engine's intra-op thread count (None: not chosen there), which replay takes: a batched
                step's kernels may split their work by it.
            from_start: it records from the session's first frame (only then is it replayable).
            weights_sha256: `weights_digest` of the served model.
            snapshot: the snapshot the session was started from (None: none).
            snapshot_state: that snapshot's state bytes, kept beside the log (`SNAPSHOT_FILE`) for replay.

        Raises:
            RecordingRefused: the quota is full or the log cannot be written.
        """
        if session.id in self.live:
            raise RecordingRefused(f"session {session.id} is already recording")
        if (self.folder(session.id) / EVENTS_FILE).exists():
            raise RecordingRefused(f"session {session.id} has a recording already (one a session; it is kept for "
                                   "its retention time)")
        used = self.used_bytes()
        if used + self.config.max_session_bytes * (2 if self.video is not None else 1) > self.config.max_total_bytes:
            raise RecordingRefused(f"the recordings quota is full ({used} of {self.config.max_total_bytes} bytes "
                                   "used; finished recordings are deleted after their retention)")
        folder = self.folder(session.id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / TOKEN_FILE).write_text(hashlib.sha256(session.token.encode()).hexdigest())
            image = session.conditioning.image
            image_digest = None if image is None else save_image(folder, image)
            state_digest = None
            if snapshot_state is not None:
                (folder / SNAPSHOT_FILE).write_bytes(snapshot_state)
                state_digest = hashlib.sha256(snapshot_state).hexdigest()
            header = {
                "worldcast": _version(), "session_id": session.id, "model": session.model.spec.name,
                "fps": session.model.spec.fps,
                "model_arg": self.identity.get("model"), "weights": self.identity.get("weights"),
                "weights_sha256": weights_sha256, "device": device, "snapshot": snapshot,
                "snapshot_sha256": state_digest, "served": served, "threads": threads,
                "seed": session.seed,
                "mode": session.mode, "prompt": session.conditioning.text, "image_sha256": image_digest,
                "context_version": session.inputs.context_version, "from_start": from_start,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            log = EventLog(folder / EVENTS_FILE, header, max_bytes=self.config.max_session_bytes, clock=self.clock)
        except OSError as e:
            raise RecordingRefused(f"the recording could not be started: {e.strerror or e}") from None
        if self.video is not None:
            try:
                self._videos[session.id] = self.video(session, folder / VIDEO_FILE)
            except OSError as e:
                log.close(f"the video could not be started: {e.strerror or e}")
                raise RecordingRefused(f"the recording could not be started: {e.strerror or e}") from None
        self.live[session.id] = log
        self.kept.pop(session.id, None)
        log.on_closed = lambda: self.finished(session.id)
        return log

    def discard(self, session_id: str) -> None:
        """Delete a recording at once (its session never started: nothing worth keeping)."""
        self.finished(session_id)
        self.kept.pop(session_id, None)
        if _SESSION_ID.match(session_id):
            _remove(self.config.directory / session_id)

    def finished(self, session_id: str) -> None:
        """The session's recording ended (stopped or closed): its video is closed, and it is kept for the retention
        time from now."""
        video = self._videos.pop(session_id, None)
        if video is not None:
            try:
                t = asyncio.get_running_loop().create_task(video.aclose(), name=f"recording-video-{session_id}")
                self._closing.add(t)
                t.add_done_callback(self._closing.discard)
            except RuntimeError:  # no loop (a test without one): nothing runs the video's encode either
                pass
        if self.live.pop(session_id, None) is not None or (self.folder(session_id) / EVENTS_FILE).exists():
            self.kept[session_id] = self.clock()

    def events(self, session_id: str, token: str, name: str = EVENTS_FILE) -> Path:
        """A file of a session's recording (its event log, or `VIDEO_FILE`), for its token.

        Raises:
            RecordingNotFound: none, or not this token's.
        """
        folder = self.folder(session_id)
        try:
            want = (folder / TOKEN_FILE).read_text().strip()
        except OSError:
            raise RecordingNotFound(session_id) from None
        if not secrets_equal(want, hashlib.sha256(token.encode()).hexdigest()):
            raise RecordingNotFound(session_id)
        if name not in (EVENTS_FILE, VIDEO_FILE):
            raise RecordingNotFound(session_id)
        path = folder / name
        if not path.exists():
            raise RecordingNotFound(session_id)
        return path

    def sweep(self) -> list[str]:
        """Delete finished recordings past their retention; returns their session ids."""
        now = self.clock()
        gone = [sid for sid, at in self.kept.items() if now - at > self.config.retention_s]
        for sid in gone:
            del self.kept[sid]
            if _SESSION_ID.match(sid):
                _remove(self.config.directory / sid)
            logger.info("recordings: deleted %s (past the retention of %.0f s)", sid, self.config.retention_s)
        return gone


def secrets_equal(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("worldcast")
    except PackageNotFoundError:
        return "unknown"


def repair_log(path: Path) -> bool:
    """Make a log an earlier server left mid-recording end properly: drop a cut last line, add an ``end`` event
    (reason "server_stopped"). Returns whether it changed anything (a log that ends already is left as it is)."""
    data = path.read_bytes()
    if not data:
        return False
    cut = data.rfind(b"\n") + 1
    complete = data[:cut]
    lines = complete.splitlines()
    last: dict[str, Any] = {}
    if lines:
        try:
            parsed = json.loads(lines[-1])
        except ValueError:  # not JSON, or not UTF-8
            parsed = {}
        last = parsed if isinstance(parsed, dict) else {}
    if cut == len(data) and last.get("type") in ("end", "stopped"):
        return False
    t = last.get("t", 0.0) if isinstance(last.get("t"), int | float) else 0.0
    end = json.dumps({"type": "end", "t": t, "reason": "server_stopped"}, separators=(",", ":")) + "\n"
    path.write_bytes(complete + end.encode())
    return True
