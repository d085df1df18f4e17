"""Show that each Matrix-Game encoder parity test can fail: break the thing it checks, run it, expect a failure.

    python -m tests.models.matrix_game.mutations_encoders            # every mutation (a few minutes on 2 cores)
    python -m tests.models.matrix_game.mutations_encoders --only a   # one of them

As `tests/models/causal_wan/mutations.py`: each mutation runs in a child process that imports
the tests first, then replaces one piece of `worldcast.models.matrix_game` by a broken version
(everywhere it is referenced, the test modules included; never a reference), then runs the
tests listed for it. The run is a pass when every mutated run fails and the same tests pass
unmutated (the control). Not part of the normal suite; the outcome is recorded in
`models/matrix_game/README.md` ("The image encoders").
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

F = "tests/models/matrix_game/"
FIX = F + "test_matrix_release_fixtures.py::"
#: item -> (what is broken, the tests that must then fail)
MUTATIONS: dict[str, tuple[str, list[str]]] = {
    "a": ("first-frame latents not normalised (the raw posterior mean)",
          [FIX + "test_matrix_first_frame_condition_equals_release_cond_concat",
           F + "test_matrix_vae_encoder.py::test_matrix_vae_encode_equals_diffusers"]),
    "b": ("CLIP features from the last layer instead of the penultimate one",
          [FIX + "test_matrix_clip_equals_release_encode_video",
           F + "test_matrix_image_encoder.py::test_matrix_clip_equals_transformers_penultimate_layer"]),
    "c": ("CLIP resize bilinear with antialiasing instead of the release's bicubic",
          [FIX + "test_matrix_clip_equals_release_encode_video"]),
    "d": ("crop box truncated instead of PIL's round-half-even",
          [FIX + "test_matrix_fit_image_equals_release_crop_and_resize"]),
    "e": ("first-frame latents dropped (zeros beside the mask)",
          [FIX + "test_matrix_first_frame_condition_equals_release_cond_concat"]),
    "f": ("conditioning horizon one frame short",
          [F + "test_matrix_vae_encoder.py::test_matrix_vae_condition_horizon_is_where_the_image_stops_mattering"]),
    "g": ("CLIP to_qkv split as k, q, v",
          [FIX + "test_matrix_clip_equals_release_encode_video"]),
    "h": ("mask set on every latent frame, not only frame 0",
          [FIX + "test_matrix_first_frame_condition_equals_release_cond_concat"]),
}  # fmt: skip


def _replace(old: object, new: object) -> None:
    """Point every module attribute that is `old` at `new` (the tests import functions by name)."""
    for mod in list(sys.modules.values()):
        for name, value in list(vars(mod).items()) if mod is not None else []:
            if value is old:
                setattr(mod, name, new)


def _break(item: str) -> None:
    from worldcast.models.matrix_game import image_encoder, loading_encoders, preprocess, vae_encoder

    if item == "a":
        encode = vae_encoder.WanVAEEncoder.encode

        def raw(self, video, **kw):  # type: ignore[no-untyped-def]
            z = encode(self, video, **kw)
            mean = torch.tensor(self.cfg.latents_mean, dtype=z.dtype).view(1, -1, 1, 1, 1)
            std = torch.tensor(self.cfg.latents_std, dtype=z.dtype).view(1, -1, 1, 1, 1)
            return z * std + mean
        vae_encoder.WanVAEEncoder.encode = raw  # type: ignore[method-assign]
    elif item == "b":
        image_encoder.ClipVisionConfig.run_layers = property(lambda self: self.layers)  # type: ignore[assignment,method-assign]
    elif item == "c":
        def bilinear(image, size):  # type: ignore[no-untyped-def]
            x = torch.nn.functional.interpolate(image, size=(size, size), mode="bilinear", antialias=True) * 0.5 + 0.5
            mean = torch.tensor(image_encoder.CLIP_MEAN, dtype=x.dtype).view(1, 3, 1, 1)
            return (x - mean) / torch.tensor(image_encoder.CLIP_STD, dtype=x.dtype).view(1, 3, 1, 1)
        _replace(image_encoder.clip_pixels, bilinear)
    elif item == "d":
        def truncated(height, width, *, target_height, target_width):  # type: ignore[no-untyped-def]
            if height / width > target_height / target_width:
                new_w, new_h = width, int(width * target_height / target_width)
            else:
                new_w, new_h = int(height * target_width / target_height), height
            left, top = (width - new_w) // 2, (height - new_h) // 2
            return left, top, left + new_w, top + new_h
        _replace(preprocess.crop_box, truncated)
    elif item in ("e", "h"):
        cond = vae_encoder.first_frame_condition

        def broken(vae, image, **kw):  # type: ignore[no-untyped-def]
            t = cond(vae, image, **kw)
            if item == "e":
                t[:, vae_encoder.MASK_CHANNELS:] = 0
            else:
                t[:, : vae_encoder.MASK_CHANNELS] = 1
            return t
        _replace(cond, broken)
    elif item == "f":
        horizon = vae_encoder.WanVAEEncoder.condition_horizon
        vae_encoder.WanVAEEncoder.condition_horizon = lambda self: horizon(self) - 1  # type: ignore[method-assign]
    elif item == "g":
        convert = loading_encoders.clip_state_from_original

        def kqv(state, cfg, *, what):  # type: ignore[no-untyped-def]
            out = convert(state, cfg, what=what)
            for k in [k for k in out if ".self_attn.q_proj." in k]:
                kk = k.replace("q_proj", "k_proj")
                out[k], out[kk] = out[kk], out[k]
            return out
        _replace(convert, kqv)
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
        rc = {m: subprocess.run([sys.executable, "-m", "tests.models.matrix_game.mutations_encoders", "--child", item,
                                 str(int(m))], capture_output=True, text=True).returncode for m in (False, True)}
        good = rc[False] == 0 and rc[True] == 1  # pytest: 0 all passed, 1 some failed
        ok &= good
        print(f"({item}) {what}: control {'passes' if rc[False] == 0 else f'FAILS (rc {rc[False]})'}, "
              f"mutated {'fails' if rc[True] == 1 else f'DOES NOT FAIL (rc {rc[True]})'}"
              f"{'' if good else '  <-- not shown'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
