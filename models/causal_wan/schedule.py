"""The few-step flow-matching schedule exactly as the references compute it: a float32 table, nearest entry.

Self-Forcing, CausVid and LongLive all build one scheduler for sampling
(Self-Forcing / LongLive `utils/scheduler.py`, CausVid
`causvid/models/wan/flow_match.py`: DiffSynth's `FlowMatchScheduler` with
`sigma_min=0`, `extra_one_step=True`, `set_timesteps(1000)`), in torch's
default float32:

    sigma_i = linspace(1, 0, 1001)[i]          i = 0..999 (the final 0 dropped)
    sigma_i = shift * sigma_i / (1 + (shift - 1) * sigma_i)
    timestep_i = sigma_i * 1000

A denoising step list (e.g. [1000, 750, 500, 250]) becomes the timesteps the
network's time embedding sees: with `warp_denoising_step` the table entry
`timestep[1000 - k]` (a 0 appended at index 1000), else `k` itself (CausVid's
integer steps). Every noise level the sampler uses is then looked up as the
table's `sigma` at the entry nearest that timestep (`argmin |timestep - t|`,
in `add_noise` and in `_convert_flow_pred_to_x0`), so a timestep and its
noise level are two different numbers: CausVid's step 757 is embedded as
757.0 and denoised at sigma = 0.756... (the nearest of its shift-8 table).

`FlowSchedule` reproduces those float32 numbers bit for bit (the same torch
ops, in the same order, on the CPU) and hands them out as Python floats; the
parity fixtures (tests/models/causal_wan/fixtures/) were made from the
references' own scheduler objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class FlowSchedule:
    """A reference sampling schedule: the step list, its shift and warp, and the float32 table behind them.

    Args:
        steps: denoising steps in [0, num_train_timesteps], descending, e.g. (1000, 750, 500, 250);
            a trailing 0 (CausVid's config lists one) is not a step and must be left out.
        shift: the table's timestep shift (Esser et al. 2024, SD3 eq. 23; 5.0 Self-Forcing, 8.0 CausVid).
        warp: map each step through the table (`timestep[1000 - k]`; Self-Forcing, LongLive), or use it as is.
        num_train_timesteps: table length (1000).

    Raises:
        ValueError: empty steps, a step outside (0, num_train_timesteps], steps not descending, shift <= 0.
    """

    steps: tuple[int, ...]
    shift: float
    warp: bool
    num_train_timesteps: int = 1000

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a schedule needs at least one denoising step")
        if self.shift <= 0:
            raise ValueError(f"shift must be positive, got {self.shift}")
        for k in self.steps:
            if not 0 < k <= self.num_train_timesteps:
                raise ValueError(f"denoising step {k} outside (0, {self.num_train_timesteps}]")
        if list(self.steps) != sorted(self.steps, reverse=True) or len(set(self.steps)) != len(self.steps):
            raise ValueError(f"denoising steps must be strictly descending, got {self.steps}")

    @cached_property
    def table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigmas, timesteps), float32 (num_train_timesteps,) each, as the references' scheduler builds them."""
        n = self.num_train_timesteps
        sigmas = torch.linspace(1.0, 0.0, n + 1, dtype=torch.float32, device="cpu")[:-1]
        sigmas = self.shift * sigmas / (1 + (self.shift - 1) * sigmas)
        return sigmas, sigmas * n

    @cached_property
    def timesteps(self) -> tuple[float, ...]:
        """What the time embedding sees at each step, descending in (0, num_train_timesteps]."""
        if not self.warp:
            return tuple(float(k) for k in self.steps)
        _, ts = self.table
        full = torch.cat([ts, torch.zeros(1, dtype=torch.float32, device="cpu")])
        return tuple(float(full[self.num_train_timesteps - k]) for k in self.steps)

    def sigma_at(self, timestep: float) -> float:
        """The table's sigma at the entry nearest `timestep` (the reference's `argmin |timesteps - t|`)."""
        sigmas, ts = self.table
        i = int(torch.argmin((ts.double() - float(timestep)).abs()))
        return float(sigmas[i])

    @cached_property
    def sigmas(self) -> tuple[float, ...]:
        """The noise level of each step (flow time; x_t = (1 - sigma) x0 + sigma eps), descending in (0, 1]."""
        return tuple(self.sigma_at(t) for t in self.timesteps)
