"""Show that each causal-Wan parity test can fail: break the thing it checks, run it, expect a failure.

    python -m tests.models.causal_wan.mutations            # every mutation (about a minute on 2 cores)
    python -m tests.models.causal_wan.mutations --only b   # one of them

Each mutation runs in a child process: the test modules are imported first, then one function of
`worldcast.models.causal_wan` is replaced by a broken version (never the test's own reference),
then pytest runs the tests of that parity item. The run is a pass when every mutated test fails and
the same tests pass without the mutation (the control). Nothing here runs in the normal suite; the
outcome is recorded in `models/causal_wan/README.md`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable

import torch

#: parity item -> (what is broken, the tests that must then fail)
MUTATIONS: dict[str, tuple[str, list[str]]] = {
    "a": ("the timestep sinusoid's halves swapped ([sin | cos] instead of Wan's [cos | sin])",
          ["tests/models/causal_wan/test_dit.py::test_one_chunk_equals_wan_transformer_fp64"]),
    "b": ("RoPE positions restart at 0 in every chunk (the frame offset ignored)",
          ["tests/models/causal_wan/test_rollout.py::test_cached_rollout_equals_block_causal_full_forward"]),
    "c": ("the VAE decoder's causal-conv cache read as zeros between chunks",
          ["tests/models/causal_wan/test_vae.py::test_streaming_decode_equals_whole_decode"]),
    "d": ("sink frames not kept visible once the window is exceeded",
          ["tests/models/causal_wan/test_window.py::test_window_and_sinks_equal_the_dense_mask"]),
    "e": ("a batch's RoPE positions all taken from its first session",
          ["tests/models/causal_wan/test_rollout.py::test_batch_of_sessions_equals_each_alone"]),
}


def _break(item: str) -> None:
    """Replace one function of the implementation by a broken version (in this process only)."""
    from worldcast.models.causal_wan import dense_attention, dit, vae

    if item == "a":
        def swapped(t: torch.Tensor, dim: int) -> torch.Tensor:
            half = dim // 2
            freqs = torch.pow(10000.0, -torch.arange(half, device=t.device, dtype=torch.float64) / half)
            arg = t.to(torch.float64)[:, None] * freqs
            return torch.cat([arg.sin(), arg.cos()], dim=1)
        dit.timestep_sinusoid = swapped
    elif item in ("b", "e"):
        forward: Callable = dit.CausalWanDiT.forward

        def broken_forward(self, x, t, frame_offset, *a, **kw):  # type: ignore[no-untyped-def]
            off = torch.zeros_like(frame_offset) if item == "b" else frame_offset[:1].expand_as(frame_offset)
            return forward(self, x, t, off.contiguous(), *a, **kw)
        dit.CausalWanDiT.forward = broken_forward
    elif item == "c":
        def zeros(self):  # type: ignore[no-untyped-def]
            t = self.old[self.i]
            self.i += 1
            return torch.zeros_like(t)
        vae._Cache.take = zeros
    elif item == "d":
        visible = dense_attention.visible_key_frames

        def no_sinks(key_frame, chunk_end, *, local_attn_size, sink_size):  # type: ignore[no-untyped-def]
            return visible(key_frame, chunk_end, local_attn_size=local_attn_size, sink_size=0)
        dense_attention.visible_key_frames = no_sinks
    else:
        raise ValueError(f"unknown mutation {item!r}")


def _child(item: str, mutate: bool) -> int:
    import importlib

    import pytest

    _, tests = MUTATIONS[item]
    for node in tests:  # import the tests (and their references) before anything is broken
        importlib.import_module(node.split("::")[0].removesuffix(".py").replace("/", "."))
    if mutate:
        _break(item)
    return int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *tests]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted(MUTATIONS), action="append", help="run these items only")
    p.add_argument("--child", nargs=2, metavar=("ITEM", "MUTATE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.exit(_child(args.child[0], args.child[1] == "1"))
    ok = True
    for item in args.only or sorted(MUTATIONS):
        what, _ = MUTATIONS[item]
        rc = {m: subprocess.run([sys.executable, "-m", "tests.models.causal_wan.mutations", "--child", item,
                                 str(int(m))], capture_output=True, text=True).returncode for m in (False, True)}
        good = rc[False] == 0 and rc[True] == 1  # pytest: 0 all passed, 1 some failed
        ok &= good
        print(f"({item}) {what}: control {'passes' if rc[False] == 0 else f'FAILS (rc {rc[False]})'}, "
              f"mutated {'fails' if rc[True] == 1 else f'DOES NOT FAIL (rc {rc[True]})'}"
              f"{'' if good else '  <-- not shown'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
