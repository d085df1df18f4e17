"""`worldcast replay`: generate a recorded session again from its event log, frame for frame.

A log made with `"record": true` (`sessions/recording.py`) holds, beyond what
the user did, what made every chunk: its sampled action vectors, the
conditioning version it used and its noise draws (`ChunkRecord`). Replay
loads the same model and weights, serves it the way the server did (dtype
and compiled buckets: `DeviceWorker.serve_way`), encodes each recorded
prompt (and the starting image kept beside the log) into the conditioning
version it made, and runs one `ChunkRollout` through the records in order: a
chunk begun and dropped on the server (preempted) draws its noise here too,
so every later chunk gets the same noise. Each frame's sha256 is compared
with the one the log holds.

Exactness holds on the same model, weights, dtype, compiled way and device
kind, for a session that ran alone in its batch: a batch of several sessions
may sum in another order on some kernels. Where the header disagrees with the
replaying machine, replay says which and still reports frame by frame which
frames matched.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine.rollout import ChunkInputs, ChunkRollout
from worldcast.engine.state_pool import StatePool
from worldcast.engine.step_output import FrameOut
from worldcast.engine.tuning.packages import machine_kind
from worldcast.engine.tuning.warmup import ServedWay
from worldcast.models.base import WorldModel
from worldcast.models.spec import Conditioning, ConditioningRequest
from worldcast.sessions.recording import Event, RecordingError, load_image, pixels_sha256, read_log, weights_digest

logger = logging.getLogger(__name__)


@dataclass
class ReplayReport:
    """What a replay made and how it compares.

    Attributes:
        frames: frames generated.
        identical: of them, those whose pixels' sha256 equals the recorded one.
        mismatched: indices of the frames that differ (or that the log does not have).
        chunks: chunk records replayed (the initial frames' included).
        dropped_draws: noise draws of chunks begun and dropped on the server, drawn again here.
        differences: what differs between the recording's machine and this one (empty: nothing known).
        fps: the model's frame rate, frames/s.
    """

    frames: int = 0
    identical: int = 0
    mismatched: list[int] = field(default_factory=list)
    chunks: int = 0
    dropped_draws: int = 0
    differences: list[str] = field(default_factory=list)
    fps: int = 0

    @property
    def exact(self) -> bool:
        return self.frames > 0 and self.identical == self.frames


class _Script:
    """The recorded inputs, one chunk at a time (a rollout's `Conditioner`)."""

    def __init__(self, contexts: dict[int, Conditioning], dim: int) -> None:
        self.contexts = contexts
        self.dim = dim
        self.version = 0
        self.actions: np.ndarray | None = None

    def sample_chunk(self, frames: int) -> ChunkInputs:
        acts = self.actions if self.actions is not None else np.zeros((frames, self.dim), np.float32)
        if acts.shape != (frames, self.dim):
            raise RecordingError(f"a chunk record has actions of shape {acts.shape}; the chunk has {frames} "
                                 f"pixel frames of {self.dim}")
        return ChunkInputs(actions=acts, context=self.contexts[self.version], action_seq=-1, epoch=0,
                           context_version=self.version)

    def current_epoch(self) -> int:
        return 0

    def wants_frames(self) -> bool:
        return True

    def input_version(self) -> int:
        return 0


#: Most noise draws one chunk record may claim (a server drops a chunk only for a fresher input: a few at most).
MAX_DRAWS = 1000


def _finite_rows(rows: object, dim: int) -> bool:
    return (isinstance(rows, list) and 0 < len(rows) <= 4096 and all(
        isinstance(r, list) and len(r) == dim and all(
            isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in r) for r in rows))


def _need(e: Event, what: str, ok: bool) -> None:
    if not ok:
        raise RecordingError(f"events.jsonl line {e.line}: {what}")


def replay(log_path: Path, *, model: WorldModel | None = None, weights: Path | None = None, device: str = "cpu",
           frames_dir: Path | None = None, export_dir: Path | None = None,
           on_frame: Any = None) -> ReplayReport:
    """Generate the recorded session of `log_path` again.

    Args:
        log_path: its `events.jsonl` (the starting image, if any, beside it in `images/`).
        model: the model to replay on, already serving the recorded way (tests; None: load the header's
            model with `weights` or the header's weights, on `device`, and serve it the recorded way).
        frames_dir: write each generated frame there as `frame_<index>.png`.
        export_dir: write `frames.npy` (uint8 (N, H, W, 3)), `actions.npy` (float32 (N, A): each frame's
            action vector; zeros for initial frames) and `index.npy` (int64 (N,) frame indices).
        on_frame: called with each generated `FrameOut`.

    Returns:
        how it went (`ReplayReport`).

    Raises:
        RecordingError: the log is not replayable (unreadable, cut, out of order, not recorded from the session's
            start, or its records contradict each other); the message names the line.
    """
    events = list(read_log(log_path))
    header = events[0].fields
    _need(events[0], "this recording began after its session started (record_start): only one made with "
          "\"record\": true at create can be replayed", header["from_start"])
    report = ReplayReport()
    served = header.get("served")
    _need(events[0], "served must be an object or null", served is None or (
        isinstance(served, dict) and isinstance(served.get("dtype"), str)
        and all(isinstance(served.get(k), list) for k in ("compiled_buckets", "package_buckets"))))
    if model is None:
        from worldcast.models import registry

        arg = header.get("model_arg") or header["model"]
        w = weights if weights is not None else (Path(header["weights"]) if header.get("weights") else None)
        model = registry.load(arg, weights=w, device=device)
        if served is not None:
            worker = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session()),
                                  on_frames=lambda f: None, on_error=lambda s, r: None)
            worker.serve_way(ServedWay(served["dtype"], tuple(served["compiled_buckets"]),
                                       tuple(served["package_buckets"])))
    spec = model.spec
    report.fps = spec.fps
    if header["model"] != spec.name:
        raise RecordingError(f"events.jsonl line 1: a recording of {header['model']!r}; this model is {spec.name!r}")
    kind = machine_kind(model.device)
    if header.get("device") not in (None, kind):
        report.differences.append(f"device kind: recorded on {header['device']}, replaying on {kind}")
    digest = weights_digest(model)
    if header.get("weights_sha256") not in (None, digest):
        report.differences.append("weights: their sha256 differs from the recorded one (other weights, or served in "
                                  "another dtype)")
    for d in report.differences:
        logger.warning("replay: %s: frames may differ", d)

    # conditioning by version: the starting one from the header, one per recorded prompt
    folder = log_path.parent
    digest_of_image = header.get("image_sha256")
    _need(events[0], "image_sha256 must be 64 hexadecimal digits or null", digest_of_image is None or (
        isinstance(digest_of_image, str) and len(digest_of_image) == 64
        and all(c in "0123456789abcdef" for c in digest_of_image)))
    _need(events[0], "prompt must be text or null", header.get("prompt") is None or isinstance(header["prompt"], str))
    image = None if digest_of_image is None else load_image(folder, digest_of_image)
    request = ConditioningRequest(text=header.get("prompt"), image=image)
    contexts = {int(header.get("context_version", 0)): model.encode_conditioning(request)}
    for e in events:
        if e.type == "prompt":
            request = request.with_text(e.fields["text"])
            contexts[e.fields["context_version"]] = model.encode_conditioning(request)

    recorded = {e.fields["index"]: e.fields["sha256"] for e in events if e.type == "frame"}
    script = _Script(contexts, spec.actions.dim)
    pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session(), device=model.device)
    rollout = ChunkRollout(str(header.get("session_id", "replay")), model, pool, script, seed=header["seed"])
    made: list[FrameOut] = []
    acts: list[np.ndarray] = []

    def take(frames: list[FrameOut], actions: np.ndarray | None) -> None:
        for i, f in enumerate(frames):
            if export_dir is not None:
                made.append(f)
            report.frames += 1
            if recorded.get(f.frame_index) == pixels_sha256(f.image):
                report.identical += 1
            else:
                report.mismatched.append(f.frame_index)
            if export_dir is not None:
                acts.append(actions[i] if actions is not None else np.zeros(spec.actions.dim, np.float32))
            if on_frame is not None:
                on_frame(f)
            if frames_dir is not None:
                from PIL import Image

                frames_dir.mkdir(parents=True, exist_ok=True)
                Image.fromarray(f.image).save(frames_dir / f"frame_{f.frame_index:06d}.png")

    chunks = [e for e in events if e.type == "chunk"]
    _need(events[0], "no chunk records: nothing to replay", bool(chunks))
    initialised = False
    try:
        with torch.no_grad():  # as the engine runs (compiled steps were traced without inference mode)
            for e in chunks:
                c = e.fields
                if c["actions"] is None:  # the initial frames
                    _need(e, "initial frames after the session's first chunk", not initialised)
                    _need(e, f"an unknown conditioning version {c['context_version']}",
                          c["context_version"] in contexts)
                    script.version, script.actions = c["context_version"], None
                    take(rollout.init(0.0), None)
                    initialised = True
                    report.chunks += 1
                    continue
                if not initialised:  # a model that starts from noise makes no initial frames
                    _need(e, f"an unknown conditioning version {c['cached_version']}", c["cached_version"] in contexts)
                    script.version, script.actions = c["cached_version"], None
                    take(rollout.init(0.0), None)
                    initialised = True
                _need(e, f"chunk of latent frame {c['first_latent']} out of order (expected {rollout.next_latent})",
                      c["first_latent"] == rollout.next_latent)
                _need(e, f"an unknown conditioning version {c['context_version']}", c["context_version"] in contexts)
                _need(e, f"draws must lie within 1..{MAX_DRAWS}", 1 <= c["draws"] <= MAX_DRAWS)
                _need(e, "actions must be rows of finite numbers", _finite_rows(c["actions"], spec.actions.dim))
                script.actions = None  # a dropped chunk's actions do not matter: only its noise draw does
                for _ in range(c["draws"] - 1):  # begun and dropped on the server: its noise was drawn there too
                    rollout.begin_chunk(0.0, 0.0)
                    rollout.abort_chunk()
                    report.dropped_draws += 1
                actions = np.asarray(c["actions"], dtype=np.float32)
                script.version, script.actions = c["context_version"], actions
                rollout.begin_chunk(0.0, 0.0)
                for step in range(spec.denoising_steps):
                    rollout.step(step)
                take(rollout.finalize(0.0), actions)
                report.chunks += 1
    finally:
        rollout.close()
    if export_dir is not None:
        export_dir.mkdir(parents=True, exist_ok=True)
        np.save(export_dir / "frames.npy", np.stack([f.image for f in made]) if made else np.zeros((0,), np.uint8))
        np.save(export_dir / "actions.npy", np.stack(acts) if acts else np.zeros((0, spec.actions.dim), np.float32))
        np.save(export_dir / "index.npy", np.asarray([f.frame_index for f in made], np.int64))
    counts = Counter(e.type for e in events)
    logger.info("replay: %d chunks, %d frames, %d identical to the recording (%d actions, %d prompts in the log)",
                report.chunks, report.frames, report.identical, counts["action"], counts["prompt"])
    return report
