"""Parameters and declared state per session of the full-size variants, built on the meta device (no memory).

    python -m worldcast.models.matrix_game.state_sizes [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import torch

from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.matrix_game.conditioning import fake_encoders
from worldcast.models.matrix_game.config import PRESETS
from worldcast.models.matrix_game.controls import CONTROLS
from worldcast.models.matrix_game.dit import MatrixGameDiT
from worldcast.models.matrix_game.loading import MatrixGameParts
from worldcast.models.matrix_game.model import MatrixGameModel


def state_bytes(variant: str, dtype: torch.dtype = torch.bfloat16) -> tuple[int, dict[str, int]]:
    """(DiT parameters, {state kind: bytes per session}) of a variant at its release geometry."""
    cfg = PRESETS[variant]()
    with torch.device("meta"):
        dit = MatrixGameDiT(cfg).cast(dtype)
        vae = WanVAEDecoder(cfg.vae).to(dtype)
        m = MatrixGameModel(MatrixGameParts(cfg, dit, vae, fake_encoders()), controls=CONTROLS[variant], name=variant)
    by: dict[str, int] = {}
    for s in m.spec.states:
        kind = "vae" if s.name.startswith("vae.") else s.name
        by[kind] = by.get(kind, 0) + s.bytes_per_session()
    return dit.num_params(), by


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    dtype = getattr(torch, p.parse_args().dtype)
    for v in ("universal", "gta-drive", "templerun"):
        n, by = state_bytes(v, dtype)
        parts = ", ".join(f"{k} {b / 1e6:.1f} MB" for k, b in by.items())
        print(f"{v}: {n / 1e9:.3f} B DiT parameters; per session {sum(by.values()) / 1e9:.2f} GB ({parts})")


if __name__ == "__main__":
    main()
