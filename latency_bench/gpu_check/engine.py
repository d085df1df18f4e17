"""The served path of a model, timed chunk by chunk: the device check's engine measurements.

`engine_rows` runs the rollout functions the device worker runs (every denoising step, decode, commit pass)
on sessions in one `StatePool`; `long_session` follows one session past its trained horizon; and
`checkpoint_chains` loads each family's generated checkpoints (its registry entry's `checkpoint_check`)
through the family's factory and times them the same way. Used by `latency_bench/gpu_check/parts.py`.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.timing import DeviceTimer
from worldcast.models import registry
from worldcast.models.base import WorldModel
from worldcast.models.spec import ConditioningRequest


def _conditioner(model: WorldModel) -> ScriptedConditioner:
    """A scripted conditioner with the model's default prompt (or default image) encoded once."""
    spec = model.spec
    context = None
    if spec.conditioning.image is None or spec.conditioning.image.default is not None:
        context = model.encode_conditioning(ConditioningRequest())  # the default prompt (or default image)
    return ScriptedConditioner(spec, context=context)


def engine_rows(model: WorldModel, device: str, *, batches: list[int], chunks: int) -> list[dict[str, object]]:
    """Time the served path of `model` per batch size (sessions sharing each batched step).

    Each chunk runs the rollout functions the device worker runs (every denoising step, decode, commit
    pass) on sessions in one state pool; the first chunk of a session (its first-chunk decode) is not
    timed. Times are device times (CUDA events on a GPU).

    Args:
        model: a loaded model on `device`.
        device: "cpu" or "cuda[:N]".
        batches: session counts, each run on a fresh pool.
        chunks: timed chunks per session count (after one untimed).

    Returns:
        One row per session count: "chunk_ms" (mean over chunks, ms, split into "denoise_ms" and
        "decode_commit_ms"), "pixel_fps_per_session" and "pixel_fps_total" (frames/s at that chunk time),
        "state_bytes_per_session" and "state_bytes_by_kind" (bytes), "peak_memory_bytes" (CUDA only, else 0).

    Raises:
        torch.OutOfMemoryError: the sessions' state or activations do not fit the device.
    """
    spec = model.spec
    out: list[dict[str, object]] = []
    for b in batches:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session() * b, device=device)
        rs = [ChunkRollout(f"s{i}", model, pool, _conditioner(model), seed=i) for i in range(b)]
        for r in rs:
            r.init(0.0)
        cache, timer = BatchCache(), DeviceTimer(torch.device(device))
        times: dict[str, list[float]] = {"denoise": [], "commit": []}
        for c in range(chunks + 1):  # the first chunk (first-chunk decode) is not timed
            run_chunk_batch(rs, cache, timer=timer)
            samples = timer.drain()
            if c:
                for kind, _, sec in samples:
                    times[kind].append(sec)
        denoise_s = sum(times["denoise"]) / chunks
        commit_s = sum(times["commit"]) / chunks  # decode + commit pass
        chunk_s = denoise_s + commit_s
        frames = spec.frames_per_chunk
        out.append({
            "spec": spec.name, "batch": b, "chunk_ms": chunk_s * 1e3,
            "denoise_ms": denoise_s * 1e3, "decode_commit_ms": commit_s * 1e3,
            "pixel_fps_per_session": frames / chunk_s, "pixel_fps_total": b * frames / chunk_s,
            "state_bytes_per_session": spec.state_bytes_per_session(),
            "state_bytes_by_kind": spec.state_bytes_by_kind(),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0,
        })
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out[-1].items()}), flush=True)
        del rs, pool
    return out


def long_session(model: WorldModel, device: str, *, chunks: int, horizon_frames: int | None = None
                 ) -> list[dict[str, object]]:
    """One session for `chunks` chunks: per chunk its first latent frame, whether it is past the model's trained
    horizon, the decoded frames' spread and mean absolute change from the previous frame, and the device memory
    in use (which a rolling window keeps constant). With random weights this shows the path and the memory, not
    whether real content drifts; run it with a real checkpoint for that."""
    spec = model.spec
    pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session(), device=device)
    r = ChunkRollout("long", model, pool, _conditioner(model), seed=0)
    r.init(0.0)
    cache, rows, prev = BatchCache(), [], None
    for c in range(chunks):
        first = r.next_latent
        frames = np.stack([f.image for f in run_chunk_batch([r], cache)]).astype(np.float32)
        seq = frames if prev is None else np.concatenate([prev[None], frames])
        past = horizon_frames is not None and first + spec.latent_frames_per_chunk > horizon_frames
        rows.append({"chunk": c, "first_latent": first, "past_horizon": past, "pixel_std": float(frames.std()),
                     "mean_abs_frame_change": float(np.abs(np.diff(seq, axis=0)).mean()),
                     "memory_allocated_bytes": torch.cuda.memory_allocated() if device.startswith("cuda") else 0})
        prev = frames[-1]
    r.close()
    return rows


def checkpoint_chains(device: str, *, smoke: bool, out: Path, batches: list[int], chunks: int,
                      long_chunks: int) -> dict[str, object]:
    """Every family's `checkpoint_check` models, loaded from the layouts it writes (under `out`, removed after),
    with the state pool planned from the device's free memory, then `engine_rows` per batch size that fits and,
    where the family asks, `long_session` for `long_chunks` chunks. Returns {family: {label: entry}}.

    Raises:
        whatever the family's checkpoint writer or loader raises (OSError, WeightsError, ...).
    """
    from worldcast.engine.device_worker import EngineConfig, plan_engine_memory

    report: dict[str, object] = {}
    for fam in registry.families():
        if not fam.checkpoint_check:
            continue
        module, _, func = fam.checkpoint_check.partition(":")
        models = getattr(importlib.import_module(module), func)
        root = Path(tempfile.mkdtemp(prefix=f"{fam.name}-chain-", dir=out))
        rows: dict[str, object] = {}
        try:
            for label, model, info in models(device, smoke=smoke, workdir=root):
                plan = plan_engine_memory(model, EngineConfig(max_batch=max(batches)))
                entry = dict(info) | {
                    "model": model.spec.name, "memory_plan": plan.describe(), "sessions_that_fit": plan.fit_slots,
                    "state_bytes_by_kind": plan.by_kind,
                    "rows": engine_rows(model, device, batches=[b for b in batches if b <= plan.num_slots],
                                        chunks=chunks)}
                if info.get("long_session"):
                    entry["long_session"] = long_session(model, device, chunks=long_chunks,
                                                         horizon_frames=info.get("horizon_frames"))
                rows[label] = entry
                del model
        finally:
            shutil.rmtree(root, ignore_errors=True)
        report[fam.name] = rows
    return report
