"""A session's whole engine-side state as bytes: what moves between engines at a chunk boundary.

`capture` reads, on the device thread and between two chunks (nothing
staged), everything the engine holds for one session:

- its state-pool slot: every tensor of every declared state (KV rings with
  their frame indices, prompt caches, decoder caches, ...), byte for byte;
- its rollout counters: the next latent frame, the conditioning version its
  caches were built for, the chunk serial, its seed;
- its sampler's RNG state (`torch.Generator.get_state`), so the noise of the
  next chunk is the noise the session would have drawn where it was;
- its schedule: phase, the next chunk's deadline and start (absolute
  seconds on CLOCK_MONOTONIC, which every process of a host shares),
  frames and chunks done, frames late;
- its conditioner's state when the conditioner can say it (a session's
  `SessionConditioner`, `engine/conditioner.py`: epoch, wants, the encoded conditioning,
  held keys, seq, axis positions and pending axis movement).

`restore` writes the same into a fresh slot of another engine's pool and
rollout. The format is deterministic (a JSON header with sorted keys, then
the raw bytes in declared order), so the same state gives the same bytes
on every engine: `capture(restore(b)) == b`.

Format: b"WCSS", uint32 version, uint32 header length (little endian), the
UTF-8 JSON header, then the payload the header's `parts` index by offset.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from worldcast.engine.conditioner import ConditionerState
from worldcast.engine.errors import SessionStateError
from worldcast.engine.rollout import ChunkRollout
from worldcast.engine.step_scheduler import Phase, SessionSchedule
from worldcast.models.spec import WorldModelSpec

MAGIC = b"WCSS"
VERSION = 2  #: 2: the conditioner keeps named axes (moves, positions), not a mouse pair
_PREFIX = struct.Struct("<4sII")


def fingerprint(spec: WorldModelSpec) -> list[list[Any]]:
    """Every declared state tensor as [state, tensor, dtype, shape]: two engines take each other's
    sessions only if these agree."""
    return [[s.name, t, str(dt), list(shape)] for s in spec.states for t, (shape, dt) in s.tensors().items()]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).cpu().numpy().tobytes()


@dataclass(frozen=True)
class CapturedSession:
    """A parsed session state (see `parse`).

    Attributes:
        header: the JSON header.
        parts: name -> raw bytes of each payload part.
    """

    header: dict[str, Any]
    parts: dict[str, bytes]

    @property
    def schedule(self) -> SessionSchedule:
        h = self.header["schedule"]
        return SessionSchedule(phase=Phase(h["phase"]), step=0, deadline_s=h["deadline_s"],
                               start_at_s=h["start_at_s"], frames=h["frames"], chunks=h["chunks"],
                               late_frames=h["late_frames"], early_starts=h.get("early_starts", 0))

    @property
    def conditioner(self) -> ConditionerState | None:
        c = self.header.get("conditioner")
        if c is None:
            return None
        context = {name: np.frombuffer(self.parts[f"context/{name}"], dtype=np.dtype(dt)).reshape(shape).copy()
                   for name, dt, shape in c["context"]}
        return ConditionerState(epoch=c["epoch"], wants_frames=c["wants_frames"], context_version=c["context_version"],
                                context=context, held=tuple(c["held"]), seq=c["seq"],
                                moves=tuple((n, v) for n, v in c["moves"]),
                                positions=tuple((n, v) for n, v in c["positions"]),
                                input_version=c.get("input_version", 0))


def capture(r: ChunkRollout, schedule: SessionSchedule) -> bytes:
    """The session's whole state as bytes (device thread, between chunks).

    Raises:
        ValueError: a chunk is staged (a session moves only at a chunk boundary).
    """
    if r.staged is not None or schedule.phase == Phase.RUNNING:
        raise ValueError(f"session {r.session_id} has a chunk in flight; capture it at a chunk boundary")
    spec = r.model.spec
    parts: list[tuple[str, bytes]] = []
    for s in spec.states:
        for t, x in r.pool.tensors[s.name].items():
            parts.append((f"state/{s.name}/{t}", _tensor_bytes(x[r.slot])))
    assert r.generator is not None
    parts.append(("rng", _tensor_bytes(r.generator.get_state())))
    cond_header = None
    get_state = getattr(r.conditioner, "conditioner_state", None)
    if get_state is not None:
        c: ConditionerState = get_state()
        ctx = c.context or {}
        names = sorted(ctx)
        for name in names:
            parts.append((f"context/{name}", np.ascontiguousarray(ctx[name]).tobytes()))
        cond_header = {"epoch": c.epoch, "wants_frames": c.wants_frames, "context_version": c.context_version,
                       "held": list(c.held), "seq": c.seq, "moves": [[n, float(v)] for n, v in c.moves],
                       "positions": [[n, float(v)] for n, v in c.positions],
                       "input_version": c.input_version,
                       "context": [[n, np.asarray(ctx[n]).dtype.str, list(np.shape(ctx[n]))] for n in names]}
    offset, index = 0, []
    for name, b in parts:
        index.append([name, offset, len(b)])
        offset += len(b)
    sched = asdict(schedule)
    sched["phase"] = int(schedule.phase)
    del sched["step"]
    header = {
        "model": spec.name, "states": fingerprint(spec), "session_id": r.session_id, "seed": r.seed,
        "next_latent": r.next_latent, "context_version": r.context_version, "serial": r._serial,
        "draws": r.draws, "last_commit": list(r.last_commit),
        "generator_device": r.generator.device.type, "schedule": sched, "conditioner": cond_header, "parts": index,
    }
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return b"".join([_PREFIX.pack(MAGIC, VERSION, len(head)), head, *(b for _, b in parts)])


def parse(blob: bytes, spec: WorldModelSpec | None = None) -> CapturedSession:
    """Split bytes from `capture` into header and parts, checking them against `spec` if given.

    Raises:
        SessionStateError: not a session state, another version, or another model's state.
    """
    if len(blob) < _PREFIX.size:
        raise SessionStateError("too short to be a session state")
    magic, version, n = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise SessionStateError("not a worldcast session state")
    if version != VERSION:
        raise SessionStateError(f"session state version {version}; this engine reads version {VERSION}")
    try:
        header = json.loads(blob[_PREFIX.size:_PREFIX.size + n])
    except ValueError as e:
        raise SessionStateError(f"malformed session state header: {e}") from None
    base = _PREFIX.size + n
    parts = {name: blob[base + off:base + off + size] for name, off, size in header["parts"]}
    if any(len(parts[name]) != size for name, _, size in header["parts"]):
        raise SessionStateError("session state is truncated")
    if spec is not None and (header["model"] != spec.name or header["states"] != fingerprint(spec)):
        raise SessionStateError(f"a session state of {header['model']!r} cannot move to an engine serving "
                                f"{spec.name!r} (declared state differs)")
    return CapturedSession(header, parts)


def rebase(blob: bytes, now_s: float) -> bytes:
    """The same state with its schedule moved in time so that its next chunk may start at `now_s` (s,
    CLOCK_MONOTONIC), its deadline as far after that as it was after its start: what a snapshot restored later
    (`sessions/snapshots.py`) needs, where a move keeps the times it had.

    Raises:
        SessionStateError: not a session state of this version.
    """
    captured = parse(blob)
    header = dict(captured.header)
    sched = dict(header["schedule"])
    shift = now_s - sched["start_at_s"]
    sched["start_at_s"] = now_s
    sched["deadline_s"] = sched["deadline_s"] + shift
    header["schedule"] = sched
    old = _PREFIX.size + _PREFIX.unpack_from(blob)[2]
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(head)) + head + blob[old:]


def restore(r: ChunkRollout, captured: CapturedSession) -> None:
    """Write a captured state into `r` (its slot allocated, blank) and its rollout counters (device thread).

    Raises:
        SessionStateError: the RNG state is of another kind of device than `r`'s generator.
    """
    h = captured.header
    assert r.generator is not None
    if h["generator_device"] != r.generator.device.type:
        raise SessionStateError(f"the session's sampler state is for a {h['generator_device']} generator; this "
                                f"engine's is {r.generator.device.type}")
    for s in r.model.spec.states:
        for t, x in r.pool.tensors[s.name].items():
            raw = captured.parts[f"state/{s.name}/{t}"]
            dst = x[r.slot]
            if dst.numel() == 0:
                continue
            src = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dst.dtype).reshape(dst.shape)
            dst.copy_(src)
    r.generator.set_state(torch.frombuffer(bytearray(captured.parts["rng"]), dtype=torch.uint8))
    r.seed = h["seed"]
    r.next_latent = h["next_latent"]
    r.context_version = h["context_version"]
    r._serial = h["serial"]
    r.draws = h["draws"]
    b, row = h.get("last_commit", (1, 0))
    r.last_commit = (int(b), int(row))
