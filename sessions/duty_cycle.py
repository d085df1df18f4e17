"""DutyCycleMeter: the share of recent time a session spends generating.

An exponentially weighted time average with time constant `tau_s`: an
interval of length dt in state a contributes a * tau * (1 - exp(-dt / tau))
while older history decays by exp(-dt / tau). State changes are reported as
they happen; time is passed in.
"""

from __future__ import annotations

import math


class DutyCycleMeter:
    """Time-weighted EWMA of a boolean "generating" state.

    Args:
        now_s: creation time, s (monotonic).
        tau_s: time constant of the average, s.
    """

    def __init__(self, now_s: float, *, tau_s: float = 120.0) -> None:
        self.tau_s = tau_s
        self.started_s = now_s
        self._last_s = now_s
        self._active = False
        self._active_w = 0.0
        self._total_w = 0.0

    def update(self, now_s: float, active: bool) -> None:
        """Account the time since the last update in the previous state, then switch to `active`."""
        dt = max(0.0, now_s - self._last_s)
        decay = math.exp(-dt / self.tau_s)
        w = self.tau_s * (1 - decay)
        self._active_w = self._active_w * decay + (w if self._active else 0.0)
        self._total_w = self._total_w * decay + w
        self._last_s = now_s
        self._active = active

    def value(self, now_s: float) -> float:
        """Duty cycle in [0, 1] up to `now_s` (1 or 0 by the current state before any time has passed)."""
        self.update(now_s, self._active)
        if self._total_w <= 0:
            return 1.0 if self._active else 0.0
        return self._active_w / self._total_w

    def observed_s(self, now_s: float) -> float:
        return now_s - self.started_s
