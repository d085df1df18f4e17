"""The parts of the prepared device check (`runner.py` beside this file runs each in a process of its own).

Each part is a function `(cpu: bool) -> dict` returning JSON-ready results; `cpu=True` runs the same code
paths at tiny sizes on the CPU (the rehearsal). A part that finds something wrong but ran to the end says so
with `"passed": False`; one that does not apply here returns `{"not_applicable": why}`; one that cannot go on
raises. Imports stay inside the parts and never reach the
network edge (pydantic, fastapi, aiortc, av, livekit): the lent machine's image has none of them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

#: The checkout (the gpu-marked tests are run from here).
REPO = Path(__file__).resolve().parents[2]
#: Served-path models per part: (registered name on the GPU, on the CPU; session counts on the GPU, on the CPU).
ENGINE_MODELS: dict[str, tuple[str, str, tuple[int, ...], tuple[int, ...]]] = {
    "causal_wan": ("causal-wan:1.3b-random", "causal-wan:tiny", (1, 2), (1, 2)),
    "matrix_game": ("matrix-game-2:universal-random", "matrix-game-2:tiny", (1, 3), (1, 3)),
}
#: Session counts of TinyWorld's engine bench (GPU, CPU).
BENCH_SESSIONS = ((1, 2, 4, 8), (1, 2))
#: The network edge's packages: the lent image has none of them, and the check must not need them.
NETWORK_EDGE = ("pydantic", "fastapi", "starlette", "aiortc", "av", "livekit", "websockets", "uvicorn")
#: Largest error of the Triton kernel against the PyTorch path by dtype (tests/gpu/test_cuda.py's tolerances).
RING_TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 3e-2}


def _device(cpu: bool) -> str:
    if not cpu and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device (run with --cpu for the rehearsal)")
    return "cpu" if cpu else "cuda"


def environment(cpu: bool) -> dict[str, Any]:
    """The interpreter, library versions and device the check ran with, and which of `NETWORK_EDGE` exist here."""
    import importlib.util

    import numpy

    out: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__,
                           "cuda_available": torch.cuda.is_available()}
    for name in ("triton", "transformers", "safetensors", "sentence_transformers"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    out["network_edge_present"] = [n for n in NETWORK_EDGE if importlib.util.find_spec(n) is not None]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out |= {"device": p.name, "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                "memory_bytes": p.total_memory, "cuda": torch.version.cuda}
    else:
        out["device"] = "cpu"
    return out


def pytest_gpu(cpu: bool) -> dict[str, Any]:
    """`pytest -m gpu tests/gpu` (on the CPU every test skips); the summary line and its counts."""
    t = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                        "tests/gpu"], cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = (t.stdout + t.stderr).strip().splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", ln)), "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    return {"returncode": t.returncode, "summary": summary.strip("= "), "counts": counts,
            "passed": t.returncode == 0 and not counts.get("failed"), "tail": "\n".join(lines[-40:])}


def _ring_case(device: str, dtype: torch.dtype, *, tokens: int, heads: int, head_dim: int, frames: int,
               sinks: int, window: int, slots: list[int], starts: list[int], seed: int = 0) -> tuple[Any, ...]:
    """Random ring-attention inputs: queries (B, F*T, H, D), a pool ring (S, P*T, H, D), and its `RingBatch`."""
    from worldcast.kernels.ring_attention import RingBatch

    g = torch.Generator(device=device).manual_seed(seed)
    S, P = max(slots) + 1, sinks + window
    k_ring, v_ring = (torch.randn(S, P * tokens, heads, head_dim, generator=g, device=device, dtype=dtype)
                      for _ in range(2))
    ring_frame = torch.full((S, P), -1, dtype=torch.int64, device=device)
    for s, c0 in zip(slots, starts, strict=True):
        for j in range(c0):
            ring_frame[s, j if j < sinks else sinks + (j - sinks) % window] = j
    q, k, v = (torch.randn(len(slots), frames * tokens, heads, head_dim, generator=g, device=device, dtype=dtype)
               for _ in range(3))
    batch = RingBatch(ring_frame, torch.tensor(slots, device=device), tuple(slots),
                      torch.tensor([[c + f for f in range(frames)] for c in starts], device=device), tokens, window,
                      sinks, torch.linspace(0.5, 0.0, heads, device=device))
    return q, k, v, k_ring, v_ring, batch


def _time_ms(fn: Any, device: str, *, repeats: int) -> float:
    """Median time of `fn()` in ms after one warm-up call (CUDA events on a GPU)."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def ring_attention(cpu: bool) -> dict[str, Any]:
    """The Triton ring-attention kernel against the PyTorch path at causal Wan 1.3B's shape (480x832: 1560 tokens
    per latent frame, 12 heads of 128, chunks of 3 frames, 2 sessions; CPU: a tiny shape, and the PyTorch path
    against the reference, since Triton needs CUDA): max abs error and median time per dtype."""
    from worldcast.kernels.ring_attention import (
        ring_attention_reference,
        ring_attention_torch,
        ring_attention_triton,
        triton_enabled,
    )

    device = _device(cpu)
    shape = (dict(tokens=8, heads=2, head_dim=16, frames=2, sinks=1, window=3) if cpu else
             dict(tokens=1560, heads=12, head_dim=128, frames=3, sinks=3, window=9))
    rows, passed = [], True
    for dtype in (torch.float32, torch.bfloat16):
        args = _ring_case(device, dtype, slots=[3, 0], starts=[0, 7 * shape["frames"]], **shape)
        torch_out = ring_attention_torch(*args).float()
        row: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "shape": shape, "sessions": 2,
                               "torch_ms": _time_ms(lambda a=args: ring_attention_torch(*a), device,
                                                    repeats=3 if cpu else 10)}
        if triton_enabled(torch.device(device)):
            err = (ring_attention_triton(*args).float() - torch_out).abs().max().item()
            row |= {"triton_ms": _time_ms(lambda a=args: ring_attention_triton(*a), device, repeats=10),
                    "triton_vs_torch_max_abs_err": err}
        else:  # the CPU rehearsal: the PyTorch path against the reference (Triton runs only on CUDA)
            err = (ring_attention_reference(*args).float() - torch_out).abs().max().item()
            row |= {"triton_ms": None, "torch_vs_reference_max_abs_err": err}
        row["tolerance"] = RING_TOLERANCE[dtype]
        passed &= err < RING_TOLERANCE[dtype]
        rows.append(row)
        del args, torch_out
    return {"rows": rows, "passed": passed}


def _engine_model(part: str, cpu: bool) -> dict[str, Any]:
    """One registered model's served path per session count, with the engine's state budget plan."""
    from worldcast.engine.device_worker import EngineConfig, plan_engine_memory
    from worldcast.latency_bench.gpu_check.engine import engine_rows
    from worldcast.models import registry

    gpu_name, cpu_name, gpu_sessions, cpu_sessions = ENGINE_MODELS[part]
    device, name, sessions = _device(cpu), cpu_name if cpu else gpu_name, cpu_sessions if cpu else gpu_sessions
    t0 = time.perf_counter()
    model = registry.load(name, device=device)
    load_s = time.perf_counter() - t0
    plan = plan_engine_memory(model, EngineConfig(max_batch=max(sessions)))
    return {"model": name, "precision": str(model.precision).removeprefix("torch."), "load_s": load_s,
        "state_plan": {"describe": plan.describe(), "slot_bytes": plan.slot_bytes, "by_kind": plan.by_kind,
                       "budget_bytes": plan.budget_bytes, "num_slots": plan.num_slots, "fit_slots": plan.fit_slots,
                       "headroom_bytes": plan.headroom_bytes},
        "rows": engine_rows(model, device, batches=list(sessions), chunks=1 if cpu else 3)}


def causal_wan(cpu: bool) -> dict[str, Any]:
    """Causal Wan 1.3B at 480x832, random weights in the serving dtype (bf16 on CUDA), 1 and 2 sessions."""
    return _engine_model("causal_wan", cpu)


def matrix_game(cpu: bool) -> dict[str, Any]:
    """Matrix-Game 2.0 universal at full size, random weights, 1 and 3 sessions."""
    return _engine_model("matrix_game", cpu)


def _tinyworld_bench(cpu: bool, *, graphs: bool) -> dict[str, Any]:
    """TinyWorld's engine bench (`latency_bench/engine_bench.py`'s `run_mode`) at each session count of
    `BENCH_SESSIONS`, always active, CUDA graphs on (compiled buckets 1, 2, 4, 8 up to the session count) or off.
    On the CPU: eager, float32, one thread, 1 s windows (compiling for the CPU takes minutes on a 2-core machine)."""
    from worldcast.engine.device_worker import EngineConfig, plan_engine_memory
    from worldcast.latency_bench.engine_bench import run_mode
    from worldcast.models import registry

    device = _device(cpu)
    model = registry.load(registry.DEFAULT_MODEL, device=device)
    sessions = BENCH_SESSIONS[1] if cpu else BENCH_SESSIONS[0]
    plan = plan_engine_memory(model, EngineConfig(max_batch=max(sessions)))
    rows = []
    for n in sessions:
        r = run_mode(model, sessions=n, seconds=1.0 if cpu else 4.0, warmup_s=0.5 if cpu else 1.0, max_batch=8,
                     threads=1 if cpu else None, precision="float32" if cpu else None, compile=graphs,
                     compile_buckets=tuple(b for b in (1, 2, 4, 8) if b <= n))
        rows.append({"cuda_graphs": graphs} | r)
        print(json.dumps({k: rows[-1][k] for k in ("cuda_graphs", "sessions", "total_fps", "compiled_buckets")}),
              flush=True)  # progress in the log, should a later session count run out of time
    return {"model": model.spec.name, "state_plan": {"describe": plan.describe(), "slot_bytes": plan.slot_bytes,
                                                     "num_slots": plan.num_slots}, "rows": rows}


def tinyworld_eager(cpu: bool) -> dict[str, Any]:
    """TinyWorld's engine bench at 1/2/4/8 sessions (CPU: 1, 2), eager steps (CUDA graphs off)."""
    return _tinyworld_bench(cpu, graphs=False)


def tinyworld_graphs(cpu: bool) -> dict[str, Any]:
    """TinyWorld's engine bench at 1/2/4/8 sessions with CUDA graphs on; not applicable on the CPU."""
    if cpu:
        return {"not_applicable": "CUDA graphs need CUDA"}
    return _tinyworld_bench(cpu, graphs=True)


def checkpoint_chains(cpu: bool) -> dict[str, Any]:
    """Opt-in (`--parts checkpoint_chains`): every family's checkpoint chain (`latency_bench/gpu_check/engine.py`)."""
    import tempfile

    from worldcast.latency_bench.gpu_check.engine import checkpoint_chains as chains

    with tempfile.TemporaryDirectory(prefix="worldcast-chains-") as d:
        return chains(_device(cpu), smoke=cpu, out=Path(d), batches=[1, 2] if cpu else [1, 2, 4],
                      chunks=1 if cpu else 3, long_chunks=8 if cpu else 12)
