"""Choosing the compute precision and compiled steps by measurement, gated by quality.

A model declares the dtypes it can run in and a tolerance
(`models.spec.PrecisionSpec`). At warm-up (`engine/tuning/warmup.py`) the engine
runs the same chunks in each dtype, eager and (where it compiles) compiled,
and records a `Trial` per dtype: the chunk time of each way of running it and
the worst frame PSNR against the reference dtype's frames. `choose` keeps
the fastest way whose dtype qualifies. Ties go to the simpler way: the order
reference-eager, reference-compiled, other dtypes eager, then compiled, and a
later way must beat the best earlier one by `min_gain` (a share of its time)
to be chosen, so measurement noise never flips the choice to the more complex
path for nothing.

No I/O and no clock: the numbers come in, so the choice is testable with
made-up timings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: A later (more complex) way must be this share faster than the best simpler one.
MIN_GAIN = 0.05

#: A non-reference dtype whose warm eager chunk ran this many times slower than the reference's gets no graphs.
#: Compiled steps (graphs or packages) took 0.59-1.0x of the same dtype's eager chunk on the machines measured
#: (BENCHMARKS.md, the issue 19 chunk tables), so a dtype 2x slower eager cannot win compiled; on a CPU
#: without bf16 units (AVX2 only: bf16 eager is 5-6x fp32) its graphs would only add a minute to a cold start.
MAX_COMPILE_RATIO = 2.0


def worth_compiling(eager_s: float, reference_eager_s: float, *, max_ratio: float = MAX_COMPILE_RATIO) -> bool:
    """Whether to build a dtype's graphs, from its warm eager chunk time and the reference's (s, each on
    `timing.work_clock`: thread CPU time on a one-thread CPU).

    Both are the fastest chunk after the first of the same quality check (`warmup._timed_check`): first
    calls pay costs that differ between dtypes and say nothing of the steady state.
    """
    return eager_s <= max_ratio * reference_eager_s


def frame_psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of uint8 frames `a` against `b` (same shape, ..., H, W, 3), dB, peak 255; inf when equal.

    PSNR = 10 log10(255^2 / MSE) (the measure of `models/tinyworld/evaluate.py`).

    Raises:
        ValueError: shapes differ.
    """
    if a.shape != b.shape:
        raise ValueError(f"frames of shape {a.shape} and {b.shape} cannot be compared")
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def min_psnr_db(frames: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The worst per-frame PSNR of `frames` against `reference` (frame by frame), dB.

    Raises:
        ValueError: the lists differ in length (or a frame in shape).
    """
    if len(frames) != len(reference) or not frames:
        raise ValueError(f"{len(frames)} frames against {len(reference)} reference frames")
    return min(frame_psnr_db(a, b) for a, b in zip(frames, reference, strict=True))


@dataclass(frozen=True)
class Trial:
    """What warm-up measured of one dtype.

    Attributes:
        dtype: its name, e.g. "bfloat16".
        eager_s: chunk time at batch 1 run eager, s (None: not measured, e.g. it failed).
        compiled_s: chunk time at batch 1 with compiled steps, s (None: not compiled or failed).
        psnr_db: worst frame PSNR of its eager frames against the reference dtype's eager frames, dB
            (inf for the reference itself).
        compiled_psnr_db: the same for its compiled frames (a compiled way qualifies only at or above
            the tolerance too, the reference's included).
        error: why this dtype could not run (None: it ran).
        compile_skipped: why its graphs were not built (None: built, or nothing compiles here).
    """

    dtype: str
    eager_s: float | None
    compiled_s: float | None = None
    psnr_db: float = math.inf
    compiled_psnr_db: float = math.inf
    error: str | None = None
    compile_skipped: str | None = None


@dataclass(frozen=True)
class PrecisionChoice:
    """The served dtype and whether its steps run compiled, with everything measured to choose it.

    Attributes:
        dtype: the served compute dtype's name.
        compiled: whether its steps run from compiled graphs (at batch 1; larger buckets are measured
            one by one, `engine/tuning/warmup.py`).
        trials: every dtype's measurements, the reference first.
        min_psnr_db: the model's tolerance, dB.
        measured: False when configured, not measured (then `trials` may be empty).
        reason: one line on why (for the log).
    """

    dtype: str
    compiled: bool
    trials: tuple[Trial, ...] = ()
    min_psnr_db: float = 0.0
    measured: bool = True
    reason: str = ""
    compiled_buckets: tuple[int, ...] = field(default=())  #: buckets served from compiled graphs

    def qualified(self, trial: Trial) -> bool:
        return trial.error is None and trial.psnr_db >= self.min_psnr_db

    def describe(self) -> str:
        """One log line: the choice and every timing."""
        how = "compiled" if self.compiled else "eager"
        if not self.measured:
            return f"{self.dtype}, {how} ({self.reason or 'set by configuration'})"

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1e3:.1f} ms"

        parts = []
        def db(x: float) -> str:
            return "exact" if math.isinf(x) else f"{x:.1f} dB"

        for t in self.trials:
            q = "" if self.qualified(t) else (f" (failed: {t.error})" if t.error else " (below tolerance)")
            comp = (f"compiled not built ({t.compile_skipped})" if t.compile_skipped else
                    f"compiled {ms(t.compiled_s)} ({db(t.compiled_psnr_db)})")
            parts.append(f"{t.dtype}: eager {ms(t.eager_s)} ({db(t.psnr_db)}), {comp}{q}")
        return (f"{self.dtype}, {how}, the fastest within {self.min_psnr_db:g} dB of the reference "
                f"(chunk at batch 1: {'; '.join(parts)})")


def choose(trials: list[Trial], *, min_psnr_db: float, min_gain: float = MIN_GAIN) -> PrecisionChoice:
    """The fastest qualified (dtype, eager | compiled), preferring the simpler way within `min_gain`.

    Args:
        trials: one per dtype, the reference first (it always qualifies when it ran).
        min_psnr_db: the model's tolerance; another dtype qualifies at or above it.
        min_gain: share of time a later way must save over the best earlier one.

    Raises:
        ValueError: no trials, or the reference did not run.
    """
    if not trials or trials[0].eager_s is None:
        raise ValueError("the reference dtype must have run eager")
    ref = trials[0]
    ways: list[tuple[Trial, bool, float]] = [(ref, False, ref.eager_s)]  # type: ignore[list-item]
    if ref.compiled_s is not None and ref.compiled_psnr_db >= min_psnr_db:
        ways.append((ref, True, ref.compiled_s))
    others = [t for t in trials[1:] if t.error is None and t.psnr_db >= min_psnr_db]
    ways += [(t, False, t.eager_s) for t in others if t.eager_s is not None]
    ways += [(t, True, t.compiled_s) for t in others
             if t.compiled_s is not None and t.compiled_psnr_db >= min_psnr_db]
    best = ways[0]
    for w in ways[1:]:
        if w[2] < best[2] * (1 - min_gain):
            best = w
    t, compiled, sec = best
    reason = f"{t.dtype} {'compiled' if compiled else 'eager'} {sec * 1e3:.1f} ms"
    return PrecisionChoice(dtype=t.dtype, compiled=compiled, trials=tuple(trials), min_psnr_db=min_psnr_db,
                           reason=reason)
