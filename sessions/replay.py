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

A session batched with others replays exactly too: a batched forward's
kernels may sum in another order at another batch size, but no step mixes
the rows of a batch, so each row depends only on its own inputs, the batch
size and its row. The engine reports where each of a chunk's forwards ran
(`ChunkBatches`: batch size and row of every denoising step, the decode and
the commit), and replay runs each at that size and row, the other rows
taken by stand-ins (`_StandIns`: copies of the session whose outputs are
dropped), with the recorded intra-op thread count. A session started from a
snapshot replays from the snapshot's state, kept beside the log.

Exactness holds on the same model, weights, dtype, compiled way and device
kind. Where the header disagrees with the replaying machine, replay says
which and still reports frame by frame which frames matched.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldcast.engine.device_worker import DeviceWorker, EngineConfig
from worldcast.engine import session_state
from worldcast.engine.errors import SessionStateError, StepFailed
from worldcast.engine.rollout import BatchCache, ChunkInputs, ChunkRollout, denoise_batch, finalize_batch
from worldcast.engine.state_pool import StatePool
from worldcast.engine.step_output import ChunkBatches, FrameOut
from worldcast.engine.tuning.packages import machine_kind
from worldcast.engine.tuning.warmup import ServedWay
from worldcast.models.base import WorldModel, weights_digest
from worldcast.models.spec import MAX_PROMPT_CHARS, Conditioning, ConditioningRequest
from worldcast.sessions.recording import (SNAPSHOT_FILE, TAKES_DIR, VIDEO_FILE, Event, RecordingError, contained_file,
                                         load_image, pixels_sha256, read_events)

logger = logging.getLogger(__name__)


@dataclass
class ReplayReport:
    """What a replay made and how it compares.

    Attributes:
        frames: frames generated.
        identical: of them, those whose pixels' sha256 equals the recorded one.
        mismatched: indices of the frames that differ (or that the log does not have).
        unverified: indices of frames the server made whose pixels never reached it (an engine process's full
            frame ring): nothing to compare them with.
        retakes: times the world was put back where a directing segment began (`retake` events).
        chunks: chunk records replayed (the initial frames' included).
        dropped_draws: noise draws of chunks begun and dropped on the server, drawn again here.
        differences: what differs between the recording's machine and this one (empty: nothing known).
        psnr_db: (frame index, PSNR in dB) of each differing frame against the picture the recording's video
            (`video.mp4`, lossy H.264) holds of it, where it holds one: how far a replay that cannot be exact
            (another device kind, dtype or weights) is from what was served. PSNR = 10 log10(255^2 / MSE) over
            the RGB pixels (inf: equal); the film's own coding loss is in it (an identical frame measures finite
            too), so only values well below the codec's own say the frames differ in content.
        fps: the model's frame rate, frames/s.
    """

    frames: int = 0
    identical: int = 0
    mismatched: list[int] = field(default_factory=list)
    unverified: list[int] = field(default_factory=list)
    retakes: int = 0
    chunks: int = 0
    dropped_draws: int = 0
    differences: list[str] = field(default_factory=list)
    psnr_db: list[tuple[int, float]] = field(default_factory=list)
    fps: int = 0

    @property
    def exact(self) -> bool:
        return self.frames > 0 and not self.mismatched


class _Script:
    """The recorded inputs, one chunk at a time (a rollout's `Conditioner`)."""

    def __init__(self, contexts: _Contexts, dim: int) -> None:
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
#: Largest batch a chunk record may name (an engine's `max_batch` is far below it).
MAX_BATCH = 64


#: dtypes a recorded engine may have served in.
SERVED_DTYPES = ("float32", "bfloat16", "float16")
#: Largest seed a log may name (torch's generators take 64-bit seeds; sessions are given 31-bit ones).
MAX_SEED = 2**63 - 1


def _int(x: object, lo: int, hi: int = 2**63 - 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


def _int_list(x: object, most: int, lo: int, hi: int) -> bool:
    return isinstance(x, list) and len(x) <= most and all(_int(v, lo, hi) for v in x)


def _rows_within(rows: object, bounds: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether `rows` is a list of 1..4096 action vectors, each of finite numbers within `bounds` (float32 (dim,)
    least and greatest, `WorldModel.action_bounds`; a millionth of their size's slack for the float32 round trip)."""
    lo, hi = bounds
    if not (isinstance(rows, list) and 0 < len(rows) <= 4096 and all(
            isinstance(r, list) and len(r) == lo.shape[0] and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in r) for r in rows)):
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        try:
            a = np.asarray(rows, dtype=np.float64)
        except OverflowError:  # an integer beyond any float
            return False
        slack = 1e-6 * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi)))
        return bool(np.isfinite(a).all() and (a >= lo - slack).all() and (a <= hi + slack).all())


def _bounds_text(bounds: tuple[np.ndarray, np.ndarray]) -> str:
    lo, hi = bounds
    return ", ".join(f"[{a:g}, {b:g}]" for a, b in zip(lo.tolist(), hi.tolist(), strict=True))


class _Contexts:
    """Each conditioning version's encoding, made when a chunk first asks for it (a log's prompts that no chunk
    used cost nothing)."""

    def __init__(self, model: WorldModel, requests: dict[int, ConditioningRequest]) -> None:
        self.model, self.requests = model, requests
        self._made: dict[int, Conditioning] = {}

    def __contains__(self, version: object) -> bool:
        return version in self.requests

    def __getitem__(self, version: int) -> Conditioning:
        if version not in self._made:
            self._made[version] = self.model.encode_conditioning(self.requests[version])
        return self._made[version]


def _load_model(h: Event, weights: Path | None, device: str, served: dict[str, Any] | None) -> WorldModel:
    """The recorded model (the header's registry name) with `weights` (None: the registry's default for it), served
    the recorded way. The header's weights path is never opened: it names a file on the recording's machine.

    Raises:
        RecordingError: the model is not registered here, needs weights and none were given, or cannot be loaded.
    """
    from worldcast.models import registry
    from worldcast.models.errors import UnknownModel

    arg = h.fields.get("model_arg") or h.fields["model"]
    _need(h, "model_arg must be a registry name (NAME[:VARIANT], 1..128 characters)",
          isinstance(arg, str) and 0 < len(arg) <= 128)
    recorded = h.fields.get("weights")
    if isinstance(recorded, str):
        logger.info("replay: recorded with weights %s (on the recording's machine; not opened here)", recorded[:200])
    try:
        family, variant = registry.resolve(arg)
    except UnknownModel as e:
        raise RecordingError(f"events.jsonl line 1: {e}") from None
    if variant.needs_weights and weights is None:
        raise RecordingError(f"events.jsonl line 1: a recording of {arg}, whose weights are not shipped: pass the "
                             "weights it was recorded with (--weights; replay checks their sha256 against the log's)")
    try:
        model = registry.load(arg, weights=weights, device=device)
        if served is not None:
            worker = DeviceWorker(model, EngineConfig(state_budget_bytes=model.spec.state_bytes_per_session()),
                                  on_frames=lambda f: None, on_error=lambda s, r: None)
            worker.serve_way(ServedWay(served["dtype"], tuple(served["compiled_buckets"]),
                                       tuple(served["package_buckets"])))
    except Exception as e:  # noqa: BLE001 - any loader's failure (missing, unreadable, malformed weights): one line
        where = f"weights {weights}" if weights is not None else "its default weights"
        raise RecordingError(f"the model {arg} cannot be loaded with {where}: {type(e).__name__}: {e}") from None
    return model


def _need(e: Event, what: str, ok: bool) -> None:
    if not ok:
        raise RecordingError(f"events.jsonl line {e.line}: {what}")


def _place(x: object) -> bool:
    return (isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
            and 1 <= x[0] <= MAX_BATCH and 0 <= x[1] < x[0])


def _batches(e: Event, steps: int) -> ChunkBatches | None:
    """A chunk record's `batches` (None: every forward ran alone), checked.

    Raises:
        RecordingError: malformed, or not one place per denoising step.
    """
    b = e.fields.get("batches")
    if b is None:
        return None
    ok = (isinstance(b, dict) and _place(b.get("previous_commit")) and _place(b.get("decode"))
          and isinstance(b.get("denoise"), list) and len(b["denoise"]) == steps
          and all(isinstance(d, list) and len(d) == 3 and _place(d[:2]) and isinstance(d[2], bool)
                  for d in b["denoise"]))
    _need(e, f"batches must hold previous_commit and decode as [batch, row] (batch 1..{MAX_BATCH}) and "
          f"{steps} denoise places as [batch, row, lock_step]", ok)
    return ChunkBatches(tuple(b["previous_commit"]), tuple((d[0], d[1], d[2]) for d in b["denoise"]),
                        tuple(b["decode"]))


class _StandIns:
    """Rollouts standing in for the sessions a recorded one shared its batches with.

    A batched forward's kernels may sum in another order at another batch size, but each row of a batch depends
    only on its own inputs at a given batch size and row (no step mixes rows). So the recorded session's chunk is
    run at each forward's recorded batch size and row, the other rows taken by stand-ins: rollouts in slots of
    their own holding a copy of the session's state and chunk, whose outputs are discarded.
    """

    def __init__(self, real: ChunkRollout) -> None:
        self.real = real
        self.others: list[ChunkRollout] = []

    def stage(self, batches: ChunkBatches) -> None:
        """After the real chunk began: enough stand-ins for its largest batch, each a copy of the session now."""
        need = max([batches.decode[0], *(b for b, _, _ in batches.denoise)]) - 1
        r, pool = self.real, self.real.pool
        while len(self.others) < need:
            o = ChunkRollout(f"{r.session_id}~{len(self.others) + 1}", r.model, pool, r.conditioner,
                             seed=r.seed + len(self.others) + 1)
            o.slot = pool.allocate(o.session_id)
            self.others.append(o)
        st = r.staged
        assert st is not None
        for o in self.others[:need]:
            for ts in pool.tensors.values():
                for x in ts.values():
                    if x.numel():
                        x[o.slot].copy_(x[r.slot])
            o.next_latent, o.context_version = r.next_latent, r.context_version
            o.staged = dataclasses.replace(st, frames=None, decode_updates={}, denoised_at=[])

    def batch(self, size: int, row: int) -> list[ChunkRollout]:
        """`size` rollouts with the recorded session at `row`."""
        others = self.others[:size - 1]
        return [*others[:row], self.real, *others[row:]]

    def close(self) -> None:
        for o in self.others:
            o.close()


def replay(log_path: Path, *, model: WorldModel | None = None, weights: Path | None = None, device: str = "cpu",
           snapshot: Path | None = None, threads: int | None = None, frames_dir: Path | None = None,
           export_dir: Path | None = None, on_frame: Any = None) -> ReplayReport:
    """Generate the recorded session of `log_path` again.

    Args:
        log_path: its `events.jsonl` (the starting image, if any, beside it in `images/`; the state of the
            snapshot it started from, if any, beside it as `snapshot.bin`).
        model: the model to replay on, already serving the recorded way (tests; None: load the header's
            model with `weights` or the header's weights, on `device`, and serve it the recorded way).
        snapshot: the state file of the snapshot the session started from (None: `snapshot.bin` beside the log).
        threads: torch's intra-op thread count to replay with, set before any graph is built (None: as it is).
            The header's `threads` says what the engine chose; on the development VM (2 vCPUs) an engine process
            that chose 1 was reproduced bit for bit at the default of 2 and not at 1 (`make replay-check`,
            BENCHMARKS.md), so it is not applied by itself.
        frames_dir: write each generated frame there as `frame_<index>.png`.
        export_dir: write `frames.npy` (uint8 (N, H, W, 3)), `actions.npy` (float32 (N, A): each frame's
            action vector; zeros for initial frames) and `index.npy` (int64 (N,) frame indices).
        on_frame: called with each generated `FrameOut`.

    Returns:
        how it went (`ReplayReport`).

    Raises:
        RecordingError: the log is not replayable (unreadable, cut, out of order, not recorded from the session's
            start, its snapshot missing or not the one recorded, or its records contradict each other); the
            message names the line.
    """
    events = read_events(log_path)
    header = events[0].fields
    _need(events[0], "this recording began after its session started (record_start): only one made with "
          "\"record\": true at create can be replayed", header["from_start"])
    report = ReplayReport()
    served = header.get("served")
    _need(events[0], f"served must be null or an object of dtype (one of {SERVED_DTYPES}), compiled_buckets and "
          f"package_buckets (up to 16 batch sizes 1..{MAX_BATCH} each)", served is None or (
        isinstance(served, dict) and served.get("dtype") in SERVED_DTYPES
        and all(_int_list(served.get(k), 16, 1, MAX_BATCH) for k in ("compiled_buckets", "package_buckets"))))
    _need(events[0], f"seed must be an integer 0..{MAX_SEED}", 0 <= header["seed"] <= MAX_SEED)
    _need(events[0], "session_id must be text of 1..128 characters", header.get("session_id") is None or (
        isinstance(header["session_id"], str) and 0 < len(header["session_id"]) <= 128))
    _need(events[0], "context_version must be a non-negative integer", _int(header.get("context_version", 0), 0))
    for name in ("device", "weights", "model_arg"):
        _need(events[0], f"{name} must be text of up to 256 characters or null", header.get(name) is None or (
            isinstance(header[name], str) and len(header[name]) <= 256))
    for e in events:
        if e.type == "header" or e.type == "prompt":
            text = e.fields.get("prompt") if e.type == "header" else e.fields["text"]
            _need(e, f"a prompt must be text of 1..{MAX_PROMPT_CHARS} characters or null", text is None or (
                isinstance(text, str) and 0 < len(text) <= MAX_PROMPT_CHARS))
    recorded_threads = header.get("threads")
    _need(events[0], "threads must be a positive integer or null", recorded_threads is None or (
        isinstance(recorded_threads, int) and not isinstance(recorded_threads, bool)
        and 1 <= recorded_threads <= 1024))
    blob = _snapshot_state(events[0], log_path, snapshot)
    old_threads = torch.get_num_threads()
    if threads is not None:  # before any graph is built: compiled steps are specialised to the thread count
        torch.set_num_threads(threads)
    try:
        return _replay(events, log_path, model=model, weights=weights, device=device, blob=blob, served=served,
                       report=report, frames_dir=frames_dir, export_dir=export_dir, on_frame=on_frame)
    finally:
        torch.set_num_threads(old_threads)


def _replay(events: list[Event], log_path: Path, *, model: WorldModel | None, weights: Path | None, device: str,
            blob: bytes | None, served: dict[str, Any] | None, report: ReplayReport, frames_dir: Path | None,
            export_dir: Path | None, on_frame: Any) -> ReplayReport:
    header = events[0].fields
    if model is None:
        model = _load_model(events[0], weights, device, served)
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
    _need(events[0], "image_sha256 must be 64 hexadecimal digits or null", digest_of_image is None or _hex64(
        digest_of_image))
    _need(events[0], "prompt must be text or null", header.get("prompt") is None or isinstance(header["prompt"], str))
    image = None if digest_of_image is None else load_image(folder, digest_of_image)
    request = ConditioningRequest(text=header.get("prompt"), image=image)
    requests = {header.get("context_version", 0): request}
    for e in events:
        if e.type == "prompt":
            request = request.with_text(e.fields["text"])
            v = e.fields["context_version"]
            _need(e, f"conditioning version {v} is claimed by another prompt before", requests.get(v, request)
                  .text == request.text)
            requests[v] = request
    contexts = _Contexts(model, requests)

    # takes: a directing session's retake put its world back (`sessions/takes.py`); a frame's flush epoch says
    # which take made it, and a chunk's is that of the frame after it
    retakes = [e for e in events if e.type == "retake"]
    for a, b in zip(retakes, retakes[1:], strict=False):
        _need(b, "retake epochs must rise", b.fields["epoch"] > a.fields["epoch"])
    for e in retakes:
        _need(e, "state_sha256 must be 64 hexadecimal digits", _hex64(e.fields["state_sha256"]))
    starts = [e.fields["epoch"] for e in retakes]

    def take_of(epoch: int) -> int:
        return bisect.bisect_right(starts, epoch)

    recorded = {(take_of(e.fields["epoch"]), e.fields["index"]): e.fields["sha256"]
                for e in events if e.type == "frame"}
    epoch_of: dict[int, int] = {}
    last: Event | None = None
    for e in events:
        if e.type == "chunk":
            last = e
        elif e.type == "frame" and last is not None:
            epoch_of[last.line], last = e.fields["epoch"], None
    chunks = [e for e in events if e.type == "chunk"]
    _need(events[0], "no chunk records: nothing to replay", bool(chunks))
    film = _Film.of(events, folder, take_of)
    took: dict[int, int] = {}
    prev = 0
    for e in chunks:  # a chunk whose frame never came (the log's end) is of the take before it
        took[e.line] = prev = take_of(epoch_of[e.line]) if e.line in epoch_of else prev
    chunks.sort(key=lambda e: took[e.line])  # (stable: each take's chunks in log order)
    places = [_batches(e, spec.denoising_steps) for e in chunks]
    widest = max([1, *(max([b.decode[0], *(n for n, _, _ in b.denoise)]) for b in places if b is not None)])
    script = _Script(contexts, spec.actions.dim)
    bounds = model.action_bounds()
    pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session() * widest, device=model.device)
    rollout = ChunkRollout(str(header.get("session_id", "replay")), model, pool, script, seed=header["seed"])
    stand_ins = _StandIns(rollout)
    cache = BatchCache()
    made: list[FrameOut] = []
    acts: list[np.ndarray] = []

    def take(frames: list[FrameOut], actions: np.ndarray | None, number: int = 0) -> None:
        for i, f in enumerate(frames):
            if export_dir is not None:
                made.append(f)
            report.frames += 1
            want = recorded.get((number, f.frame_index))
            if want is None and (number, f.frame_index) in recorded:  # made, but its pixels never reached the server
                report.unverified.append(f.frame_index)
            elif want == pixels_sha256(f.image):
                report.identical += 1
            else:
                report.mismatched.append(f.frame_index)
                served = film.picture((number, f.frame_index), f.image.shape) if film is not None else None
                if served is not None:
                    report.psnr_db.append((f.frame_index, psnr_db(f.image, served, film.scale)))
            if export_dir is not None:
                acts.append(actions[i] if actions is not None else np.zeros(spec.actions.dim, np.float32))
            if on_frame is not None:
                on_frame(f)
            if frames_dir is not None:
                from PIL import Image

                frames_dir.mkdir(parents=True, exist_ok=True)
                Image.fromarray(f.image).save(frames_dir / f"frame_{f.frame_index:06d}.png")

    initialised = False
    try:
        if blob is not None:  # the world the snapshot kept, then its chunks
            rollout.slot = pool.allocate(rollout.session_id)
            try:
                session_state.restore(rollout, session_state.parse(blob, spec))
            except (SessionStateError, KeyError, ValueError) as e:
                raise RecordingError(f"events.jsonl line 1: the snapshot's state cannot be restored here: {e}") from None
            initialised = True
        current = 0

        def replay_chunk(n: int, e: Event) -> None:
            """Chunk record `n` (`e`) made again, its frames checked (`take`)."""
            nonlocal initialised, current
            c = e.fields
            if took[e.line] != current:  # a retake: the world as it was where the segment began
                current = took[e.line]
                _put_back(rollout, retakes[current - 1], log_path.parent, spec)
                report.retakes += 1
            if c["actions"] is None:  # the initial frames
                _need(e, "initial frames after the session's first chunk", not initialised)
                _need(e, f"an unknown conditioning version {c['context_version']}",
                      c["context_version"] in contexts)
                script.version, script.actions = c["context_version"], None
                take(rollout.init(0.0), None)
                initialised = True
                report.chunks += 1
                return
            if not initialised:  # a model that starts from noise makes no initial frames
                _need(e, f"an unknown conditioning version {c['cached_version']}", c["cached_version"] in contexts)
                script.version, script.actions = c["cached_version"], None
                take(rollout.init(0.0), None)
                initialised = True
            _need(e, f"chunk of latent frame {c['first_latent']} out of order (expected {rollout.next_latent})",
                  c["first_latent"] == rollout.next_latent)
            _need(e, f"an unknown conditioning version {c['context_version']}", c["context_version"] in contexts)
            _need(e, f"draws must lie within {rollout.draws + 1}..{MAX_DRAWS}",
                  rollout.draws < c["draws"] <= MAX_DRAWS)
            _need(e, f"actions must be rows of {spec.actions.dim} finite numbers, each within the model's "
                  f"action bounds ({_bounds_text(bounds)})", _rows_within(c["actions"], bounds))
            script.actions = None  # a dropped chunk's actions do not matter: only its noise draw does
            while rollout.draws < c["draws"] - 1:  # begun and dropped on the server: its noise was drawn there too
                rollout.begin_chunk(0.0, 0.0)
                rollout.abort_chunk()
                report.dropped_draws += 1
            actions = np.asarray(c["actions"], dtype=np.float32)
            script.version, script.actions = c["context_version"], actions
            rollout.begin_chunk(0.0, 0.0)
            after = places[n + 1] if n + 1 < len(places) and took[chunks[n + 1].line] == current else None
            take(_run_chunk(rollout, stand_ins, places[n], after, cache, report, e), actions, current)
            report.chunks += 1

        with torch.no_grad():  # as the engine runs (compiled steps were traced without inference mode)
            for n, e in enumerate(chunks):
                try:
                    replay_chunk(n, e)
                except (StepFailed, SessionStateError) as err:
                    raise RecordingError(f"events.jsonl line {e.line}: the model failed on this chunk: {err}") from None
    finally:
        stand_ins.close()
        rollout.close()
        if film is not None:
            film.close()
    if export_dir is not None:
        export_dir.mkdir(parents=True, exist_ok=True)
        np.save(export_dir / "frames.npy", np.stack([f.image for f in made]) if made else np.zeros((0,), np.uint8))
        np.save(export_dir / "actions.npy", np.stack(acts) if acts else np.zeros((0, spec.actions.dim), np.float32))
        np.save(export_dir / "index.npy", np.asarray([f.frame_index for f in made], np.int64))
    counts = Counter(e.type for e in events)
    logger.info("replay: %d chunks, %d frames, %d identical to the recording (%d actions, %d prompts in the log)",
                report.chunks, report.frames, report.identical, counts["action"], counts["prompt"])
    return report


def _run_chunk(r: ChunkRollout, stand_ins: _StandIns, places: ChunkBatches | None, after: ChunkBatches | None,
               cache: BatchCache, report: ReplayReport, e: Event) -> list[FrameOut]:
    """The begun chunk of `r`: each denoising step, its decode and its commit at the batch size and row the
    record gives (alone where it gives none); returns its frames."""
    steps = r.model.spec.denoising_steps
    if places is None:
        for k in range(steps):
            denoise_batch([r], [k], cache)
        frames = finalize_batch([r], 0.0, cache=cache)
        commit = (1, 0)
    else:
        stand_ins.stage(places)
        for k, (size, row, lock_step) in enumerate(places.denoise):
            rs = stand_ins.batch(size, row)
            # stand-ins at another step where the server's batch was not in lock step (flow times gathered by row)
            denoise_batch(rs, [k if lock_step or x is r else (k + 1) % steps for x in rs], cache)
        frames = [f for f in finalize_batch(stand_ins.batch(*places.decode), 0.0, cache=cache)
                  if f.session_id == r.session_id]
        commit = places.decode
    if after is not None and after.previous_commit != commit:
        report.differences.append(f"events.jsonl line {e.line}: its chunk's commit ran at batch/row "
                                  f"{list(after.previous_commit)} apart from its decode (a failed batch re-run), "
                                  "replayed at the decode's: later frames may differ")
    return frames


def psnr_db(image: np.ndarray, served: np.ndarray, scale: int = 1) -> float:
    """PSNR of `image` (uint8 (h, w, 3)) against `served` (uint8 (h * scale, w * scale, 3): the picture as
    encoded, upscaled by pixel repetition), in dB: 10 log10(255^2 / MSE) over every RGB value (inf: equal).

    Raises:
        ValueError: the shapes do not match at `scale`.
    """
    if scale != 1:
        image = image.repeat(scale, axis=0).repeat(scale, axis=1)
    if image.shape != served.shape:
        raise ValueError(f"a frame of shape {image.shape} at scale {scale} against a picture of {served.shape}")
    mse = float(np.mean((image.astype(np.float64) - served.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


class _Film:
    """The recording's video (`video.mp4`), decoded picture by picture as replay asks (in order; PyAV), each
    picture named by the `video` event written when it went in: (take, frame index) -> its position."""

    def __init__(self, path: Path, places: dict[tuple[int, int], int], scale: int) -> None:
        self.path, self.places, self.scale = path, places, scale
        self._frames: Any = None
        self._at = -1  #: position of the last picture decoded
        self._last: np.ndarray | None = None

    @classmethod
    def of(cls, events: list[Event], folder: Path, take_of: Any) -> _Film | None:
        video = [e for e in events if e.type == "video"]
        path = contained_file(folder, VIDEO_FILE)
        if not video or path is None:
            return None
        scale = video[0].fields.get("scale", 1)
        _need(video[0], "scale must be a positive integer", isinstance(scale, int) and not isinstance(scale, bool)
              and 1 <= scale <= 64)
        places = {(take_of(e.fields["epoch"]), e.fields["index"]): n for n, e in enumerate(video)}
        return cls(path, places, scale)

    def picture(self, key: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray | None:
        """The served picture of frame `key` (uint8 (H, W, 3) RGB), or None: the film does not hold it, it was
        passed already, its pictures are not frames of `shape` (h, w, 3) upscaled by the film's scale, or the file
        ends (or fails to decode) first."""
        n = self.places.get(key)
        if n is None or n < self._at:
            return None
        want = (shape[1] * self.scale, shape[0] * self.scale)  # (width, height)
        try:
            if self._frames is None:
                import av

                self._container = av.open(str(self.path))
                self._frames = self._container.decode(video=0)
            while self._at < n:
                frame = next(self._frames)
                if (frame.width, frame.height) != want:
                    raise ValueError(f"a picture of {frame.width}x{frame.height}; the frames upscaled are "
                                     f"{want[0]}x{want[1]}")
                self._last = frame.to_ndarray(format="rgb24")
                self._at += 1
        except Exception as e:  # noqa: BLE001 - the film only measures; any decoding failure ends its use
            logger.info("replay: the film %s ends or fails at picture %d: %s", self.path, self._at + 1, e)
            self.places = {}
            return None
        return self._last

    def close(self) -> None:
        if self._frames is not None:
            self._container.close()


def _put_back(r: ChunkRollout, e: Event, folder: Path, spec: Any) -> None:
    """Restore `r` to the state a `retake` event put the session's world back to (kept beside the log).

    Raises:
        RecordingError: the state is missing, not the recorded one, or not this model's.
    """
    digest = e.fields["state_sha256"]
    path = contained_file(folder, TAKES_DIR, f"{digest}.bin")
    if path is None:
        raise RecordingError(f"events.jsonl line {e.line}: the retake's state {TAKES_DIR}/{digest}.bin is missing "
                             "(or not a file of the log's folder)")
    try:
        state = _read_capped(path, spec.state_bytes_per_session() + 2**20)
    except OSError as err:
        raise RecordingError(f"events.jsonl line {e.line}: the retake's state {path} cannot be read "
                             f"({err.strerror or err})") from None
    _need(e, f"{path} is not the retake's state (sha256 differs)", hashlib.sha256(state).hexdigest() == digest)
    try:
        session_state.restore(r, session_state.parse(state, spec))
    except (SessionStateError, KeyError, ValueError) as err:
        raise RecordingError(f"events.jsonl line {e.line}: the retake's state cannot be restored: {err}") from None


#: Largest session state file replay reads (a snapshot's or a retake's), bytes.
MAX_STATE_BYTES = 16 * 2**30


def _read_capped(path: Path, most: int) -> bytes:
    """The bytes of `path`, at most `most` of them.

    Raises:
        OSError: unreadable, or larger than `most` (EFBIG).
    """
    import errno

    with open(path, "rb") as f:
        data = f.read(most + 1)
    if len(data) > most:
        raise OSError(errno.EFBIG, f"larger than {most} bytes")
    return data


def _hex64(x: object) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def _snapshot_state(h: Event, log_path: Path, path: Path | None) -> bytes | None:
    """The state of the snapshot a recorded session started from (None: it started afresh), checked against the
    header's sha256.

    Raises:
        RecordingError: it is missing, or not the recorded one.
    """
    sid = h.fields.get("snapshot")
    if sid is None:
        return None
    want = h.fields.get("snapshot_sha256")
    _need(h, "a session started from a snapshot needs snapshot_sha256 (64 hexadecimal digits)", _hex64(want))
    if path is None:  # beside the log: a file of its own folder only
        path = contained_file(log_path.parent, SNAPSHOT_FILE)
        if path is None:
            raise RecordingError(f"events.jsonl line 1: the session started from snapshot {sid!s:.80}, whose state "
                                 f"{SNAPSHOT_FILE} is not a file of the log's folder; pass it with --snapshot")
    try:
        blob = _read_capped(path, MAX_STATE_BYTES)
    except OSError as err:
        raise RecordingError(f"events.jsonl line 1: the session started from snapshot {sid}, whose state {path} "
                             f"cannot be read ({err.strerror or err}); pass it with --snapshot") from None
    if hashlib.sha256(blob).hexdigest() != want:
        raise RecordingError(f"events.jsonl line 1: {path} is not the state of snapshot {sid} (sha256 differs)")
    return blob
