"""ScriptedConditioner: a `Conditioner` driven by code instead of a user.

For the device worker's warm-up, the benchmarks and the tests: actions come
from a fixed vector or a callable (a key schedule), the session wants
frames while `active` (or while a callable says so), and `fault` injects a
failure into its steps. A real session's conditioner is
`sessions/session.py`'s `Session`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from worldcast.engine.rollout import ChunkInputs
from worldcast.models.spec import Conditioning, WorldModelSpec


def zero_context(spec: WorldModelSpec) -> Conditioning:
    """An encoded conditioning of zeros in the spec's declared shapes (warm-up, benchmarks)."""
    return {name: np.zeros(shape, dtype=_numpy_dtype(dt)) for name, shape, dt in spec.conditioning.tensors}


def _numpy_dtype(dt: object) -> np.dtype:
    import torch

    return torch.empty((), dtype=dt).numpy().dtype  # type: ignore[arg-type]


class ScriptedConditioner:
    """A thread-safe scripted conditioner.

    Args:
        spec: the model's spec (action size, conditioning shapes).
        action: float32 (A,) action vector for every frame, or a callable returning one per
            chunk (called on the device thread); default: zeros (no key held).
        context: the encoded conditioning (`WorldModel.encode_conditioning`); default: zeros of the
            declared shapes (`zero_context`).
        wants: whether the session generates now (called on the device thread);
            default: the `active` attribute.

    Attributes:
        active: generating while True (when `wants` is not given).
        epoch: flush epoch; bump it (`flush`, `cancel`) to make a staged chunk stale.
        seq: action seq reported with every chunk.
        fault: None, "raise" (sampling raises RuntimeError) or "nan" (a NaN conditioning poisons the step).
        samples: chunks sampled so far.
        inputs: the input counter (`push_input` bumps it, as a user's action does).
    """

    def __init__(
        self,
        spec: WorldModelSpec,
        *,
        action: np.ndarray | Callable[[], np.ndarray] | None = None,
        context: Conditioning | None = None,
        wants: Callable[[], bool] | None = None,
    ) -> None:
        self._action = action if action is not None else np.zeros(spec.actions.dim, np.float32)
        self.context = context if context is not None else zero_context(spec)
        self.context_version = 0  #: bump with a new `context` to make a prompt-caching model re-cache
        self._wants = wants
        self.active = True
        self.epoch = 0
        self.seq = -1
        self.fault: str | None = None
        self.samples = 0
        self.inputs = 0
        self.lock = threading.Lock()

    def sample_chunk(self, frames: int) -> ChunkInputs:
        with self.lock:
            self.samples += 1
            if self.fault == "raise":
                raise RuntimeError("injected failure")
            a = self._action() if callable(self._action) else self._action
            context = self.context
            if self.fault == "nan":
                context = {k: np.full_like(v, np.nan) if np.issubdtype(v.dtype, np.floating) else v
                           for k, v in context.items()}
            return ChunkInputs(actions=np.repeat(np.asarray(a, np.float32)[None], frames, 0), context=context,
                               action_seq=self.seq, epoch=self.epoch, context_version=self.context_version,
                               input_version=self.inputs)

    def current_epoch(self) -> int:
        with self.lock:
            return self.epoch

    def wants_frames(self) -> bool:
        if self._wants is not None:
            return self._wants()
        with self.lock:
            return self.active

    def input_version(self) -> int:
        with self.lock:
            return self.inputs

    def push_input(self) -> None:
        """An input arrived (as a user's action does): the next seq, the input counter bumped."""
        with self.lock:
            self.inputs += 1
            self.seq += 1

    def flush(self) -> None:
        """Make any staged chunk stale, as the `flush` RPC does."""
        with self.lock:
            self.epoch += 1

    def cancel(self) -> None:
        """Stale the staged chunk and stop generating, as `Session.cancel` does."""
        with self.lock:
            self.epoch += 1
            self.active = False
