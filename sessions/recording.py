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

import hashlib
import io
import json
import logging
import math
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


def weights_digest(model: object) -> str:
    """sha256 (hex) over every parameter and buffer of the `torch.nn.Module`s a model holds as attributes, by
    attribute and tensor name, with dtype and shape: the weights as they are served (after the served dtype is
    applied). Takes about a second a GB of weights on a CPU."""
    import torch

    h = hashlib.sha256()
    for attr in sorted(vars(model)):
        mod = getattr(model, attr)
        if not isinstance(mod, torch.nn.Module):
            continue
        for name, t in sorted(mod.state_dict().items()):
            x = t.detach().to("cpu").contiguous()
            h.update(f"{attr}.{name}:{x.dtype}:{tuple(x.shape)}".encode())
            h.update(x.view(torch.uint8).numpy().tobytes() if x.numel() else b"")
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

    path = folder / "images" / f"{digest}.png"
    if not path.exists():
        raise RecordingError(f"the starting image {path} is missing")
    image = np.asarray(Image.open(path).convert("RGB"))
    if pixels_sha256(image) != digest:
        raise RecordingError(f"the starting image {path} is not the one recorded (sha256 differs)")
    return image


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
                                  "outcome": outcome, "sha256": pixels_sha256(out.image)}
        if pts is not None:
            fields["pts"] = pts
        self.write("frame", **fields)
        if outcome == "delivered" and out.action_seq > self._applied_seq:
            self._applied_seq = out.action_seq
            self.write("applied", seq=out.action_seq, frame=out.frame_index)

    def chunk(self, c: ChunkRecord) -> None:
        self.write("chunk", first_latent=c.first_latent, draws=c.draws, cached_version=c.cached_version,
                   context_version=c.context_version,
                   actions=None if c.actions is None else [[float(v) for v in row] for row in c.actions])

    def stop(self, reason: str) -> None:
        """Stop recording (asked for): an event says so; the file is closed."""
        if self._file is not None:
            self.write("stopped", reason=reason)
        self._close(reason)

    def close(self, reason: str) -> None:
        """The session closed: an `end` event, then the file is closed (idempotent)."""
        if self._file is not None:
            self.write("end", reason=reason)
        self._close(reason)

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
    "chunk": {"first_latent": (int,), "draws": (int,), "cached_version": (int,), "context_version": (int,)},
    "frame": {"index": (int,), "epoch": (int,), "outcome": (str,), "sha256": (str,)},
    "applied": {"seq": (int,), "frame": (int,)},
    "stopped": {"reason": (str,)},
    "end": {"reason": (str,)},
}


@dataclass(frozen=True)
class Event:
    """One line of a log: its number (1-based), type and fields."""

    line: int
    type: str
    fields: dict[str, Any]


def read_log(path: Path) -> Iterator[Event]:
    """The events of a log in order, each checked (see `_REQUIRED`); times must not go back.

    Raises:
        RecordingError: "events.jsonl line N: why" for a line that is not JSON, not an event, of an unknown type,
            missing a field or with one of the wrong type, out of time order, or a first line that is not a
            header of this format.
    """
    last_t = -math.inf
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path.name} line {n}"
            if not raw.endswith("\n"):
                raise RecordingError(f"{where}: truncated (the line does not end; the log was cut short)")
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise RecordingError(f"{where}: not JSON ({e.msg})") from None
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
                if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                    raise RecordingError(f"{where}: {kind} needs {name!r} ({types[0].__name__}), got {v!r}")
            yield Event(n, kind, obj)


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
EVENTS_FILE = "events.jsonl"


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
        clock: monotonic clock, s.
    """

    def __init__(self, config: RecordingConfig, *, identity: dict[str, Any],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.identity = dict(identity)
        self.clock = clock
        self.live: dict[str, EventLog] = {}
        #: finished recordings kept: session id -> when it finished (clock, s)
        self.kept: dict[str, float] = {}
        self._digest: str | None = None
        config.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    def folder(self, session_id: str) -> Path:
        if not session_id.isalnum():
            raise RecordingNotFound(session_id)
        return self.config.directory / session_id

    def _recover(self) -> None:
        now_wall = time.time()
        for folder in sorted(p for p in self.config.directory.iterdir() if p.is_dir()):
            log = folder / EVENTS_FILE
            age = now_wall - (log.stat().st_mtime if log.exists() else folder.stat().st_mtime)
            if not log.exists() or age > self.config.retention_s:
                _remove(folder)
                logger.info("recordings: deleted %s (%s)", folder,
                            "no event log" if not log.exists() else f"{age:.0f} s old, past the retention")
                continue
            if repair_log(log):
                logger.warning("recordings: repaired %s (its server stopped mid-recording: the log now ends "
                               "with an end event, reason server_stopped)", log)
            self.kept[folder.name] = self.clock() - age

    def used_bytes(self) -> int:
        """Bytes of every kept and live recording."""
        return sum(_folder_bytes(p) for p in self.config.directory.iterdir() if p.is_dir())

    def weights_digest(self, model: object) -> str:
        """`weights_digest` of the served model (computed once; slow for large models: call off the loop)."""
        if self._digest is None:
            self._digest = weights_digest(model)
        return self._digest

    def start(self, session: Any, *, served: dict[str, Any] | None, device: str, from_start: bool) -> EventLog:
        """Start recording `session` (a `Session`) into its folder and return its log (the caller attaches it).

        Raises:
            RecordingRefused: the quota is full or the log cannot be written.
        """
        if session.id in self.live:
            raise RecordingRefused(f"session {session.id} is already recording")
        used = self.used_bytes()
        if used + self.config.max_session_bytes > self.config.max_total_bytes:
            raise RecordingRefused(f"the recordings quota is full ({used} of {self.config.max_total_bytes} bytes "
                                   "used; finished recordings are deleted after their retention)")
        folder = self.folder(session.id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / TOKEN_FILE).write_text(hashlib.sha256(session.token.encode()).hexdigest())
            image = session.conditioning.image
            image_digest = None if image is None else save_image(folder, image)
            header = {
                "worldcast": _version(), "session_id": session.id, "model": session.model.spec.name,
                "model_arg": self.identity.get("model"), "weights": self.identity.get("weights"),
                "weights_sha256": self._digest, "device": device, "served": served, "seed": session.seed,
                "mode": session.mode, "prompt": session.conditioning.text, "image_sha256": image_digest,
                "context_version": session.inputs.context_version, "from_start": from_start,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            log = EventLog(folder / EVENTS_FILE, header, max_bytes=self.config.max_session_bytes, clock=self.clock)
        except OSError as e:
            raise RecordingRefused(f"the recording could not be started: {e.strerror or e}") from None
        self.live[session.id] = log
        self.kept.pop(session.id, None)
        log.on_closed = lambda: self.finished(session.id)
        return log

    def finished(self, session_id: str) -> None:
        """The session's recording ended (stopped or closed): kept for the retention time from now."""
        if self.live.pop(session_id, None) is not None or (self.folder(session_id) / EVENTS_FILE).exists():
            self.kept[session_id] = self.clock()

    def events(self, session_id: str, token: str) -> Path:
        """The event log of a session's recording, for its token.

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
        path = folder / EVENTS_FILE
        if not path.exists():
            raise RecordingNotFound(session_id)
        return path

    def sweep(self) -> list[str]:
        """Delete finished recordings past their retention; returns their session ids."""
        now = self.clock()
        gone = [sid for sid, at in self.kept.items() if now - at > self.config.retention_s]
        for sid in gone:
            del self.kept[sid]
            _remove(self.folder(sid))
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
            last = json.loads(lines[-1])
        except json.JSONDecodeError:
            last = {}
    if cut == len(data) and last.get("type") in ("end", "stopped"):
        return False
    t = last.get("t", 0.0) if isinstance(last.get("t"), int | float) else 0.0
    end = json.dumps({"type": "end", "t": t, "reason": "server_stopped"}, separators=(",", ":")) + "\n"
    path.write_bytes(complete + end.encode())
    return True
