"""CostModel: measured step time per (step kind, batch size), updated online.

Each executed step is observed; predictions are an exponential moving
average per (kind, batch size), falling back to a linear fit through the
nearest measured batch sizes, then to a prior. Time is passed in, never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CostModel:
    """Online step-time estimates, seconds.

    Attributes:
        prior_s: prediction for a kind never measured, seconds per step.
        alpha: EMA weight of a new observation, in (0, 1].
    """

    prior_s: float = 0.02
    alpha: float = 0.2
    _ema: dict[tuple[str, int], float] = field(default_factory=dict)
    _count: dict[tuple[str, int], int] = field(default_factory=dict)

    def observe(self, kind: str, batch: int, seconds: float) -> None:
        """Record one executed step of `kind` over `batch` sessions that took `seconds`."""
        key = (kind, batch)
        old = self._ema.get(key)
        self._ema[key] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds
        self._count[key] = self._count.get(key, 0) + 1

    def predict(self, kind: str, batch: int) -> float:
        """Predicted seconds for one step of `kind` over `batch` sessions."""
        if (kind, batch) in self._ema:
            return self._ema[(kind, batch)]
        known = sorted(b for (k, b) in self._ema if k == kind)
        if not known:
            return self.prior_s * max(1, batch) ** 0.5
        lower = [b for b in known if b < batch]
        upper = [b for b in known if b > batch]
        if lower and upper:
            b0, b1 = lower[-1], upper[0]
            y0, y1 = self._ema[(kind, b0)], self._ema[(kind, b1)]
            return y0 + (y1 - y0) * (batch - b0) / (b1 - b0)
        b = lower[-1] if lower else upper[0]
        return self._ema[(kind, b)] * batch / b if lower else self._ema[(kind, b)]

    def chunk_time_s(self, batch: int, *, denoising_steps: int) -> float:
        """Predicted device time of one chunk of `batch` sessions, s: `denoising_steps` denoise steps and the
        commit step (decode and the state-writing pass). The one formula the scheduler's start times,
        admission's capacity and the start-up log use."""
        return denoising_steps * self.predict("denoise", batch) + self.predict("commit", batch)

    def copy(self) -> CostModel:
        """An independent copy (for readers on other threads)."""
        return CostModel(prior_s=self.prior_s, alpha=self.alpha, _ema=dict(self._ema), _count=dict(self._count))

    def snapshot(self) -> dict[tuple[str, int], tuple[float, int]]:
        """{(kind, batch): (ema seconds, observations)} for metrics."""
        return {k: (v, self._count[k]) for k, v in self._ema.items()}
