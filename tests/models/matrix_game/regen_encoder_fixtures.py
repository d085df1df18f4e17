"""Regenerate `data/encoders.safetensors` and `data/encoders.json` from Matrix-Game 2.0's own code.

    MATRIX_GAME_REF=/path/to/Matrix-Game/Matrix-Game-2 \\
    PYTHONPATH=/path/to/refdeps ./.venv/bin/python -m tests.models.matrix_game.regen_encoder_fixtures

`MATRIX_GAME_REF` is the `Matrix-Game-2` folder of a checkout of SkyworkAI/Matrix-Game (or a
fork of it); `MATRIX_GAME_REF_COMMIT` names its commit for the metadata (else `git rev-parse`
is tried). The reference's VAE/CLIP modules import einops, ftfy and torchvision, which the
project does not depend on: install them beside, never into the project, e.g.
`pip install --no-deps --target /path/to/refdeps einops ftfy wcwidth torchvision`
(torchvision's transforms are pure Python and import beside a newer torch).

What runs, all on CPU in float64 with seeded tiny weights (stored rounded to float32):
- the release's `WanVAE` (`wan/vae/wanx_vae_src/vae.py`) around a tiny `VideoVAE_` (its own
  class, base width 4; `WanVAE.__init__` builds the full one, which is swapped out), and the
  release's `generate_videos` lines (`inference.py`) that build `cond_concat` from the image,
  executed verbatim from the parsed source (`padding_video` .. `cond_concat`), with
  `num_output_frames` latent frames;
- the release's `CLIPModel.encode_video` (`wan/vae/wanx_vae_src/clip.py`) around a tiny
  `XLMRobertaCLIP`, with its `flash_attention` (CUDA, half precision only) replaced by
  PyTorch's scaled-dot-product attention (the same softmax(q k^T / sqrt(d)) v), and its
  LayerNorms' float32 round trip lifted (and once as shipped, for a float32-level check);
- the release's `_resizecrop` and `frame_process` (from `inference.py`'s source) on two
  synthetic images, at 352x640 (its geometry; only a SHA-256 of the pixels is kept) and at
  the tiny VAE's 32x48 (the same transforms with that size).
Nothing is copied from the reference into this repository: only the outputs are stored.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from tests.models.causal_wan.refs import lifted_fp32_casts

DATA = Path(__file__).with_name("data")
TINY_HW = (32, 48)  #: the VAE fixture's pixel frame size (4 x 6 latents)
VAE_LATENT_FRAMES = 32  #: the release's num_output_frames for the VAE fixture (> the horizon 29)
VAE_TINY = dict(dim=4, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=2, attn_scales=[],
                temperal_downsample=[False, True, True])  # fmt: skip
CLIP_TINY = dict(embed_dim=16, vision_dim=16, vision_heads=2, vision_layers=3, vision_mlp_ratio=4,
                 vocab_size=64, max_text_len=16, text_dim=16, text_heads=2, text_layers=1)  # fmt: skip


def synthetic_images() -> dict[str, np.ndarray]:
    """Two smooth uint8 RGB images whose crops exercise both branches and PIL's half-pixel rounding."""
    out = {}
    for name, (h, w), seed in (("wide", (90, 170), 1), ("tall", (120, 61), 2)):
        g = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
        chans = [np.sin(2 * np.pi * (g.uniform(0.5, 3) * yy + g.uniform(0.5, 3) * xx + g.uniform())) for _ in range(3)]
        img = (np.stack(chans, -1) * 0.45 + 0.5 + g.normal(0, 0.05, (h, w, 3))).clip(0, 1)
        out[name] = (img * 255).round().astype(np.uint8)
    return out


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _seeded_(module: torch.nn.Module, seed: int) -> None:
    """Seeded N(0, 0.3^2) weights rounded to float32 (norm gains 1 + N(0, 0.1^2)), set in place (module in float64)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            v = 1 + 0.1 * r if ("norm" in name and name.endswith((".weight", ".gamma"))) else 0.3 * r
            p.copy_(v.to(torch.float32).to(torch.float64))


def _release_source(ref: Path) -> tuple[types.FunctionType, ast.expr, list[ast.stmt]]:
    """From inference.py: `_resizecrop`, the `frame_process` expression, the `cond_concat` statements."""
    tree = ast.parse((ref / "inference.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InteractiveGameInference")
    fns = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    ns: dict = {}
    exec(compile(ast.Module([fns["_resizecrop"]], []), "inference.py", "exec"), ns)
    frame_process = next(
        s.value for s in fns["__init__"].body
        if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "self.frame_process"
    )  # fmt: skip
    body = fns["generate_videos"].body
    start = next(i for i, s in enumerate(body) if ast.unparse(s).startswith("padding_video ="))
    end = next(i for i, s in enumerate(body) if ast.unparse(s).startswith("cond_concat ="))
    return ns["_resizecrop"], frame_process, body[start : end + 1]


def main() -> None:
    ref = Path(os.environ["MATRIX_GAME_REF"]).resolve()
    commit = os.environ.get("MATRIX_GAME_REF_COMMIT") or subprocess.run(
        ["git", "-C", str(ref), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    sys.path.insert(0, str(ref / "wan"))  # the `vae` namespace package (wanx_vae.py, wanx_vae_src/)
    import vae.wanx_vae as wanx  # type: ignore[import-not-found]
    import vae.wanx_vae_src.clip as rclip  # type: ignore[import-not-found]
    import vae.wanx_vae_src.vae as rvae  # type: ignore[import-not-found]
    from PIL import Image
    from torchvision.transforms import v2  # type: ignore[import-not-found]

    def sdpa(q, k, v, **_: object):  # type: ignore[no-untyped-def]
        """[B, L, N, D] attention, unmasked (what the release's flash_attention computes)."""
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    rclip.flash_attention = sdpa
    resizecrop, frame_process_expr, cond_lines = _release_source(ref)
    images = synthetic_images()
    tensors: dict[str, torch.Tensor] = {f"image.{k}": torch.from_numpy(v) for k, v in images.items()}
    meta: dict = {"reference": {"repo": "SkyworkAI/Matrix-Game (read from the efiop/Matrix-Game fork mirror)",
                                "folder": "Matrix-Game-2", "commit": commit,
                                "files": ["inference.py", "wan/vae/wanx_vae.py", "wan/vae/wanx_vae_src/vae.py",
                                          "wan/vae/wanx_vae_src/clip.py"]},
                  "dtype": "float64 (weights rounded to float32 first)", "geometry": {}}  # fmt: skip

    # geometry: the release's crop + frame_process
    fp_release = eval(compile(ast.Expression(frame_process_expr), "inference.py", "eval"), {"v2": v2})
    fp_tiny = v2.Compose([v2.Resize(size=TINY_HW, antialias=True), v2.ToTensor(),
                          v2.Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])])  # fmt: skip
    processed = {}
    for name, img in images.items():
        for (th, tw), fp in (((352, 640), fp_release), (TINY_HW, fp_tiny)):
            x = fp(resizecrop(None, Image.fromarray(img), th, tw))  # (3, th, tw) in [-1, 1]
            u8 = ((x * 0.5 + 0.5) * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
            assert torch.equal(x, (torch.from_numpy(u8).permute(2, 0, 1).float() / 255 - 0.5) / 0.5)
            meta["geometry"][f"{name}_{th}x{tw}"] = {"source_shape": list(img.shape), "sha256": sha256(u8)}
            processed[(name, th, tw)] = x.to(torch.float64)

    # the VAE and the release's cond_concat arithmetic
    torch.manual_seed(0)
    big = rvae.WanVAE(pretrained_path=None, z_dim=16)
    big.model = rvae.VideoVAE_(**VAE_TINY).eval().requires_grad_(False)
    big = big.to(torch.float64)
    _seeded_(big.model, seed=11)
    wrapper = wanx.WanxVAEWrapper(big, None)
    this = types.SimpleNamespace(vae=wrapper, device="cpu", weight_dtype=torch.float64,
                                 args=types.SimpleNamespace(num_output_frames=VAE_LATENT_FRAMES))  # fmt: skip
    ns = {"torch": torch, "self": this, "image": processed[("wide", *TINY_HW)][None, :, None]}
    with torch.no_grad():
        exec(compile(ast.Module(cond_lines, []), "inference.py", "exec"), ns)
    tensors["vae.cond_concat"] = ns["cond_concat"].contiguous()  # (1, 20, N, 4, 6)
    tensors["vae.latents_mean"], tensors["vae.latents_std"] = big.mean.clone(), big.std.clone()  # float32-born
    tensors.update({f"vae.state.{k}": v.to(torch.float32) for k, v in big.model.state_dict().items()})
    meta["vae"] = {"config": VAE_TINY, "seed": 11, "image": f"wide at {TINY_HW[0]}x{TINY_HW[1]}",
                   "num_output_frames": VAE_LATENT_FRAMES,
                   "lines": [ast.unparse(s) for s in cond_lines]}

    # CLIP encode_video
    model, transforms = rclip.clip_xlm_roberta_vit_h_14(pretrained=False, return_transforms=True, **CLIP_TINY)
    model = model.to(torch.float64).eval().requires_grad_(False)
    _seeded_(model, seed=12)
    clip = rclip.CLIPModel.__new__(rclip.CLIPModel)  # its __init__ loads the full checkpoint and tokenizer
    torch.nn.Module.__init__(clip)
    clip.model, clip.transforms = model, transforms
    for name in images:
        with torch.no_grad(), lifted_fp32_casts():  # its LayerNorm computes through .float(): lifted
            out = clip.encode_video(processed[(name, 352, 640)][None, :, None].clone())
        tensors[f"clip.visual_context.{name}"] = out.contiguous()  # (1, 257, 16)
    with torch.no_grad():
        out = clip.encode_video(processed[("wide", 352, 640)][None, :, None].clone())
    tensors["clip.visual_context_as_shipped.wide"] = out.contiguous()  # float32 LayerNorms
    tensors.update({f"clip.state.{k}": v.to(torch.float32) for k, v in model.state_dict().items()})
    meta["clip"] = {"config": CLIP_TINY, "seed": 12, "images": "wide and tall at 352x640",
                    "substitution": "flash_attention -> torch scaled_dot_product_attention (CPU, float64)",
                    "lifted": "visual_context.*: its LayerNorm's .float() casts leave float64 alone "
                              "(tests/models/causal_wan/refs.py lifted_fp32_casts); visual_context_as_shipped: not"}

    DATA.mkdir(exist_ok=True)
    save_file(tensors, str(DATA / "encoders.safetensors"), metadata={"reference_commit": commit})
    meta["tensors"] = {k: [list(v.shape), str(v.dtype)] for k, v in sorted(tensors.items()) if ".state." not in k}
    (DATA / "encoders.json").write_text(json.dumps(meta, indent=1) + "\n")
    size = (DATA / "encoders.safetensors").stat().st_size
    print(f"wrote {DATA}/encoders.safetensors ({size / 1024:.0f} KiB) and encoders.json (reference {commit})")


if __name__ == "__main__":
    main()
