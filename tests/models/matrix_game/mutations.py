"""Show that the Matrix-Game parity test can fail: break what it checks, run it, expect a failure.

    python -m tests.models.matrix_game.mutations            # every mutation (about 6 minutes on a busy 2-core VM)
    python -m tests.models.matrix_game.mutations --only b   # one of them

Each mutation runs in a child process: the test module is imported first, then one function of
`worldcast.models.matrix_game` is replaced by a broken version, then pytest runs the parity test
against the release's fixtures. A run passes when every mutated test fails and the same test passes
unmutated (the control). Not part of the normal suite; the outcome is recorded in
`models/matrix_game/README.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import torch

PARITY = "tests/models/matrix_game/test_matrix_parity.py::test_matrix_every_denoising_step_matches_the_release_fp64"

#: item -> what is broken (every item runs the parity test on both fixtures)
MUTATIONS: dict[str, str] = {
    "a": "action module skipped (its residuals dropped; its caches still written)",
    "b": "mouse and keyboard swapped in the action vector (mouse read from the first columns)",
    "c": "wrong action RoPE base (10000 instead of the release's 256)",
    "d": "first-frame latent dropped from the input concatenation (mask kept)",
    "e": "action history not carried across chunks (read as zeros)",
    "f": "action windows one pixel frame late ([4j - 11, 4j + 1) instead of [4j - 12, 4j))",
    "g": "action caches ignored (each chunk's mouse/keyboard attention sees only itself)",
}


def _break(item: str) -> None:
    """Replace one function of the implementation by a broken version (in this process only)."""
    from worldcast.models.matrix_game import action, attention, dit
    from worldcast.models.matrix_game import model as mgm

    windows = action.action_windows
    if item == "a":
        forward = action.ActionModule.forward

        def skipped(self, x, *args, **kwargs):  # type: ignore[no-untyped-def]
            _, kv = forward(self, x, *args, **kwargs)
            return x, kv
        action.ActionModule.forward = skipped  # type: ignore[method-assign]
    elif item == "b":
        def swapped(history, chunk, first, a, *, frames):  # type: ignore[no-untyped-def]
            w = windows(history, chunk, first, a, frames=frames)
            if w.keyboard is None or w.mouse is None:
                return w
            full = torch.cat([w.keyboard, w.mouse], dim=-1)
            return action.ActionWindows(keyboard=full[..., a.mouse_dim_in:], mouse=full[..., :a.mouse_dim_in])
        mgm.action_windows = swapped
    elif item == "c":
        rope = dit.action_rope_cos_sin

        def wrong_base(frame_pos, a, *, dtype):  # type: ignore[no-untyped-def]
            return rope(frame_pos, dataclasses.replace(a, rope_theta=10000.0), dtype=dtype)
        dit.action_rope_cos_sin = wrong_base
    elif item == "d":
        cond_latents = mgm.MatrixGameModel._cond_latents

        def dropped(self, cond, state):  # type: ignore[no-untyped-def]
            out = cond_latents(self, cond, state).clone()
            out[:, self.cfg.mask_channels:] = 0
            return out
        mgm.MatrixGameModel._cond_latents = dropped  # type: ignore[method-assign]
    elif item == "e":
        def forgetful(history, chunk, first, a, *, frames):  # type: ignore[no-untyped-def]
            return windows(torch.zeros_like(history), chunk, first, a, frames=frames)
        mgm.action_windows = forgetful
    elif item == "f":
        def late(history, chunk, first, a, *, frames):  # type: ignore[no-untyped-def]
            h = torch.cat([history[:, 1:], chunk[:, :1]], dim=1)
            c = torch.cat([chunk[:, 1:], chunk[:, -1:]], dim=1)
            return windows(h, c, first, a, frames=frames)
        mgm.action_windows = late
    elif item == "g":
        def blind(ring_frame, c0, *, window, sinks):  # type: ignore[no-untyped-def]
            return torch.zeros_like(ring_frame, dtype=torch.bool)
        attention.visible_frames = blind
    else:
        raise ValueError(f"unknown mutation {item!r}")


def _child(item: str, mutate: bool) -> int:
    import importlib

    import pytest

    importlib.import_module(PARITY.split("::")[0].removesuffix(".py").replace("/", "."))
    if mutate:
        _break(item)
    return int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", PARITY]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted(MUTATIONS), action="append", help="run these items only")
    p.add_argument("--child", nargs=2, metavar=("ITEM", "MUTATE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.exit(_child(args.child[0], args.child[1] == "1"))
    ok = True
    for item in args.only or sorted(MUTATIONS):
        rc = {m: subprocess.run([sys.executable, "-m", "tests.models.matrix_game.mutations", "--child", item,
                                 str(int(m))], capture_output=True, text=True).returncode for m in (False, True)}
        good = rc[False] == 0 and rc[True] == 1  # pytest: 0 all passed, 1 some failed
        ok &= good
        print(f"({item}) {MUTATIONS[item]}: control {'passes' if rc[False] == 0 else f'FAILS (rc {rc[False]})'}, "
              f"mutated {'fails' if rc[True] == 1 else f'DOES NOT FAIL (rc {rc[True]})'}"
              f"{'' if good else '  <-- not shown'}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
