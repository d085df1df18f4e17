"""Snapshots: a live session's world kept on disk, to start any number of sessions from (resume, fork).

`POST /v1/sessions/{id}/snapshots` captures the session at its next chunk
boundary (its engine keeps serving it: `EngineHandle.capture_session`): its
whole engine state as bytes (`engine/session_state.py`: KV rings, caches,
latent counter, the sampler's RNG state, its inputs and conditioning), and
what the server knows of it: seed, prompt, starting image, the model and the
sha256 of its weights. A session created with `"snapshot": "<id>"` (and the
token of the session that made it) is restored from those bytes on an engine
with room, its schedule moved to now (`session_state.rebase`): its first
frame is the frame the original produced next, given the same inputs. The
snapshot stays: any number of sessions may start from it and diverge.

On disk (`--snapshots-dir`): a folder per snapshot with `state.bin`,
`meta.json` (format, model, weights digest, seed, prompt, the sha256 of
`state.bin` and of the creator's token) and `image.png` (a starting image,
lossless). The store is bounded (`--max-snapshots`, `--snapshot-quota-mib`):
a snapshot past either is refused with the reason, never silently evicted.
A snapshot whose files are missing, cut, edited or of another format version
is refused with the reason when used, and nothing is half restored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worldcast.sessions.errors import SnapshotNotFound, SnapshotRefused
from worldcast.sessions.recording import load_image, save_image

logger = logging.getLogger(__name__)

#: The format of `meta.json` (a snapshot of another format is refused).
FORMAT = "worldcast-snapshot/1"
STATE_FILE = "state.bin"
META_FILE = "meta.json"


@dataclass(frozen=True)
class SnapshotConfig:
    """Where snapshots go and how many may be kept.

    Attributes:
        directory: the snapshots directory (`--snapshots-dir`).
        max_snapshots: snapshots kept at most (`--max-snapshots`).
        max_total_bytes: their bytes at most (`--snapshot-quota-mib`).
    """

    directory: Path = Path("snapshots")
    max_snapshots: int = 64
    max_total_bytes: int = 4 * 2**30

    def __post_init__(self) -> None:
        if self.max_snapshots < 1 or self.max_total_bytes < 1:
            raise ValueError("snapshot limits must be positive")


@dataclass(frozen=True)
class Snapshot:
    """A snapshot read back: its id, what the server knew of the session, and its state bytes.

    Attributes:
        meta: `meta.json` (model, weights_sha256, seed, prompt, image_sha256, state_sha256, created_at, ...).
        image: the starting image, uint8 (H, W, 3), or None.
        state: the engine state (`engine/session_state.py` bytes).
    """

    snapshot_id: str
    meta: dict[str, Any]
    image: np.ndarray | None
    state: bytes


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SnapshotStore:
    """The snapshots directory of one server (survives restarts: it is read from disk each time). Event loop only.

    Args:
        config: where and how many.
        model_name: the served model's `spec.name`; a snapshot of another is refused.
    """

    def __init__(self, config: SnapshotConfig, *, model_name: str) -> None:
        self.config = config
        self.model_name = model_name
        config.directory.mkdir(parents=True, exist_ok=True)

    def folder(self, snapshot_id: str) -> Path:
        if not (snapshot_id.isascii() and snapshot_id.isalnum() and 1 <= len(snapshot_id) <= 64):
            raise SnapshotNotFound(f"no snapshot {snapshot_id[:64]!r} for this token")
        return self.config.directory / snapshot_id

    def _ids(self) -> list[str]:
        return sorted(p.name for p in self.config.directory.iterdir() if p.is_dir())

    def used_bytes(self) -> int:
        return sum(f.stat().st_size for p in self.config.directory.iterdir() if p.is_dir()
                   for f in p.iterdir() if f.is_file())

    def save(self, session: Any, state: bytes, *, weights_sha256: str, next_frame: int) -> dict[str, Any]:
        """Keep `state` (captured from `session`, a `Session`, served with weights of `weights_sha256`) as a new
        snapshot (its next frame would have been `next_frame`); returns its meta with its id.

        Raises:
            SnapshotRefused: the store is full (by count or bytes), or the disk refused (nothing is kept).
        """
        if len(self._ids()) >= self.config.max_snapshots:
            raise SnapshotRefused(f"the snapshot store holds {self.config.max_snapshots} snapshots, its most: "
                                  "delete one (DELETE /v1/snapshots/{id})")
        used = self.used_bytes()
        if used + len(state) > self.config.max_total_bytes:
            raise SnapshotRefused(f"the snapshot store is full ({used} of {self.config.max_total_bytes} bytes used; "
                                  f"this one takes {len(state)})")
        snapshot_id = secrets.token_hex(8)
        folder = self.folder(snapshot_id)
        image = session.conditioning.image
        meta = {
            "format": FORMAT, "snapshot_id": snapshot_id, "model": session.model.spec.name,
            "weights_sha256": weights_sha256, "seed": session.seed, "mode": session.mode,
            "prompt": session.conditioning.text, "from_session": session.id,
            "token_sha256": _sha(session.token.encode()), "state_sha256": _sha(state), "state_bytes": len(state),
            "next_frame": next_frame,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            folder.mkdir(parents=True)
            meta["image_sha256"] = None if image is None else save_image(folder, image)
            (folder / STATE_FILE).write_bytes(state)
            (folder / META_FILE).write_text(json.dumps(meta, sort_keys=True))  # last: its presence says complete
        except OSError as e:
            shutil.rmtree(folder, ignore_errors=True)
            raise SnapshotRefused(f"the snapshot could not be written: {e.strerror or e}") from None
        logger.info("Session(%s): snapshot %s kept (%d bytes)", session.id, snapshot_id, len(state))
        return meta

    def _meta(self, snapshot_id: str, token: str) -> tuple[Path, dict[str, Any]]:
        folder = self.folder(snapshot_id)
        try:
            meta = json.loads((folder / META_FILE).read_text())
        except (OSError, ValueError):
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} for this token") from None
        want = meta.get("token_sha256") if isinstance(meta, dict) else None
        if not isinstance(want, str) or not hmac.compare_digest(want, _sha(token.encode())):
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} for this token")
        return folder, meta

    def load(self, snapshot_id: str, token: str, *, weights_sha256: str) -> Snapshot:
        """The snapshot, for the token of the session that made it, checked whole before anything uses it (on
        this server's weights, `weights_sha256`).

        Raises:
            SnapshotNotFound: none, or not this token's.
            SnapshotRefused: of another format, model or weights, or its files are missing, cut or edited (the
                message says which).
        """
        folder, meta = self._meta(snapshot_id, token)
        if meta.get("format") != FORMAT:
            raise SnapshotRefused(f"snapshot {snapshot_id} is of format {meta.get('format')!r}; this server reads "
                                  f"{FORMAT!r}")
        if meta.get("model") != self.model_name:
            raise SnapshotRefused(f"snapshot {snapshot_id} is of model {meta.get('model')!r}; this server serves "
                                  f"{self.model_name!r}")
        if meta.get("weights_sha256") != weights_sha256:
            raise SnapshotRefused(f"snapshot {snapshot_id} was taken with other weights (their sha256 differs)")
        try:
            state = (folder / STATE_FILE).read_bytes()
        except OSError:
            raise SnapshotRefused(f"snapshot {snapshot_id}: its state file is missing") from None
        if len(state) != meta.get("state_bytes") or _sha(state) != meta.get("state_sha256"):
            raise SnapshotRefused(f"snapshot {snapshot_id}: its state file is cut or edited (size or sha256 differs "
                                  "from its meta)")
        image = None
        if meta.get("image_sha256") is not None:
            try:
                image = load_image(folder, meta["image_sha256"])
            except Exception as e:  # noqa: BLE001 - RecordingError, a PIL error: all one refusal
                raise SnapshotRefused(f"snapshot {snapshot_id}: {e}") from None
        return Snapshot(snapshot_id, meta, image, state)

    def delete(self, snapshot_id: str, token: str) -> None:
        """Remove a snapshot (the token of the session that made it).

        Raises:
            SnapshotNotFound: none, or not this token's.
        """
        folder, _ = self._meta(snapshot_id, token)
        shutil.rmtree(folder, ignore_errors=True)
        logger.info("snapshot %s deleted", snapshot_id)
