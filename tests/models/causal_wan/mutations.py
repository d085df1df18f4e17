"""Show that each causal-Wan parity test can fail: break the thing it checks, run it, expect a failure.

    python -m tests.models.causal_wan.mutations            # every mutation (a few minutes on 2 cores)
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

_REF = "tests/models/causal_wan/test_reference_parity.py"

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
    # parity with the families' own code (fixtures of test_reference_parity.py)
    "f": ("each step's noise level taken as timestep / 1000 instead of the reference table's nearest entry",
          [f"{_REF}::test_self_forcing_and_causvid_presets_compute_what_their_own_pipelines_compute[causvid]"]),
    "g": ("CausVid's steps warped through the table like Self-Forcing's",
          [f"{_REF}::test_self_forcing_and_causvid_presets_compute_what_their_own_pipelines_compute[causvid]"]),
    "h": ("the re-cache re-runs the sinks in steady state (LongLive protects them after the first window)",
          [f"{_REF}::test_longlive_preset_with_its_lora_and_recache_computes_what_longlive_computes"]),
    "i": ("the re-cache re-runs only the frames the next chunk sees (the last 6) against the sinks",
          [f"{_REF}::test_longlive_preset_with_its_lora_and_recache_computes_what_longlive_computes"]),
    "j": ("the LoRA merged at scale 1 whatever its alpha / r",
          [f"{_REF}::test_longlive_preset_with_its_lora_and_recache_computes_what_longlive_computes"]),
    "k": ("past the 21-frame horizon every frame stays visible (no rolling window)",
          [f"{_REF}::test_self_forcing_and_causvid_presets_compute_what_their_own_pipelines_compute"
           "[self_forcing_rolling]"]),
    "l": ("Wan's VAE file read with its residual blocks' two norms swapped",
          [f"{_REF}::test_wan_vae_file_decodes_as_wans_own_decoder"]),
    "m": ("Wan's umT5 file read with the gated FFN's gate and up projections swapped",
          [f"{_REF}::test_wan_umt5_file_encodes_as_wans_own_encoder"]),
}


def _break(item: str) -> None:
    """Replace one function of the implementation by a broken version (in this process only)."""
    from worldcast.models.causal_wan import dense_attention, dit, keys, recache, schedule, vae

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
    elif item == "f":
        schedule.FlowSchedule.sigma_at = lambda self, t: float(t) / self.num_train_timesteps  # type: ignore[method-assign]
    elif item == "g":
        warped = schedule.FlowSchedule.timesteps.func  # type: ignore[attr-defined]

        def always_warped(self):  # type: ignore[no-untyped-def]
            object.__setattr__(self, "warp", True)
            return warped(self)
        schedule.FlowSchedule.timesteps = property(always_warped)  # type: ignore[assignment,method-assign]
    elif item in ("h", "i"):
        def plan(next_frame, *, local_attn_size, sink_size):  # type: ignore[no-untyped-def]
            if next_frame == 0:
                return None
            if item == "h":
                n = min(local_attn_size, next_frame)
                return recache.RecachePlan(tuple(range(next_frame - n, next_frame)), keep_sinks=False)
            recent = local_attn_size - sink_size - 3
            start = max(0, next_frame - recent)
            return recache.RecachePlan(tuple(range(start, next_frame)), keep_sinks=start > 0,
                                       sink_frames=tuple(range(sink_size)) if start > 0 else ())
        recache.recache_plan = plan
    elif item == "j":
        import tests.models.causal_wan.test_reference_parity as ref_test
        from worldcast.models.causal_wan import lora

        def unscaled(state, pairs, *, alpha=None):  # type: ignore[no-untyped-def]
            return lora.merge_lora(state, pairs, alpha=None)
        ref_test.merge_lora = unscaled
    elif item == "k":
        visible = dense_attention.visible_key_frames

        def never_evicted(key_frame, chunk_end, *, local_attn_size, sink_size):  # type: ignore[no-untyped-def]
            return visible(key_frame, chunk_end, local_attn_size=-1, sink_size=sink_size)
        dense_attention.visible_key_frames = never_evicted
    elif item == "l":
        r = keys._RESIDUAL
        r["residual.0.gamma"], r["residual.3.gamma"] = r["residual.3.gamma"], r["residual.0.gamma"]
    elif item == "m":
        b = keys._T5_BLOCK
        b["ffn.gate.0.weight"], b["ffn.fc1.weight"] = b["ffn.fc1.weight"], b["ffn.gate.0.weight"]
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
