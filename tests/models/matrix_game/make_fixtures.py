"""Regenerate the Matrix-Game 2.0 parity fixtures from the release's own code (not part of the test suite).

    git clone https://github.com/SkyworkAI/Matrix-Game /tmp/Matrix-Game    # any checkout of the release
    pip install --target /tmp/mg-ref-site einops                           # its one missing pure-Python dep
    MATRIX_GAME_REF=/tmp/Matrix-Game PYTHONPATH=/tmp/mg-ref-site \
        .venv/bin/python -O -m tests.models.matrix_game.make_fixtures

MATRIX_GAME_REF is the repository root (or its `Matrix-Game-2` folder); its commit is read with git,
or from MATRIX_GAME_REF_COMMIT for an exported tree. Writes `tests/data/matrix_game/<name>.safetensors`.

What runs is the release's `CausalInferencePipeline.inference` (non-streaming, `pipeline/causal_inference.py`)
on its `WanDiffusionWrapper` / `CausalWanModel` / `ActionModule`, in float64, batch 1, with seeded tiny
weights (`tiny_weights.seeded_state` over the model's own keys), random noise, a random first-frame latent
and random CLIP features (DiT level: no VAE, no CLIP), and keyboard/mouse actions that change every few
pixel frames. Every denoising call is recorded (noisy input, timestep, x0), and the newest frames of the
self-attention, mouse and keyboard caches of every block after the last chunk.

Stubbed, because it cannot run on a CPU or at the tiny size, and nothing else:
- flash-attn: `flash_attn_func`, `wan.modules.attention.attention` and `flash_attention` -> plain softmax
  attention (SDPA) in float64;
- `torch.cuda.current_device()` -> "cpu" (the action RoPE tables are built on it);
- `Tensor.float()` -> float64, and float64 as the default dtype (so the fixtures are float64 throughout:
  the release computes its action RoPE tables and some norms through float32 casts);
- the pipeline's cache initialisers (they hard-code the full size: 30 blocks, 12 x 128 heads,
  16 x 64 action heads, 880 tokens per frame) -> the same structures at the tiny size; each
  self-attention's `max_attention_size` (hard-coded `local_attn_size * 880`) -> `local_attn_size * T`;
  the pipeline's `frame_seq_length` (880) -> T;
- `-O` drops the release's asserts that hard-code 880 tokens per frame (`ActionModule.forward`);
- the VAE decoder -> a no-op (the fixtures stop at latents); `utils.visualize` (OpenCV) and
  `wan.modules.tokenizers` (ftfy) are stubbed out of the import chain; the `wan` and `wan.modules`
  package `__init__`s are skipped (they import the text encoders and the 14B pipelines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from tests.models.matrix_game.tiny_weights import FIXTURE_CONFIGS, FIXTURE_RUNS, seeded_state

OUT = Path(__file__).resolve().parents[2] / "data" / "matrix_game"


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """(B, L, H, D) plain softmax attention (the flash-attn stand-in)."""
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return y.transpose(1, 2)


def _stub_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **_):  # type: ignore[no-untyped-def]
    assert softmax_scale is None and dropout_p == 0.0
    return _sdpa(q, k, v, causal)


def _stub_attention(q, k, v, q_lens=None, k_lens=None, causal=False, **_):  # type: ignore[no-untyped-def]
    assert q_lens is None and k_lens is None, "the inference paths pass no lengths"
    return _sdpa(q, k, v, causal)


def _import_reference(root: Path) -> types.SimpleNamespace:
    """Import the release's modules with the stubs above in place."""
    mg2 = root / "Matrix-Game-2" if (root / "Matrix-Game-2").is_dir() else root
    sys.path.insert(0, str(mg2))
    # diffusers probes for flash-attn when its (lazy) modules load: load them before the stub exists
    from diffusers.configuration_utils import ConfigMixin  # noqa: F401
    from diffusers.loaders import FromOriginalModelMixin, PeftAdapterMixin  # noqa: F401
    from diffusers.models.modeling_utils import ModelMixin  # noqa: F401

    flash = types.ModuleType("flash_attn")
    flash.flash_attn_func = _stub_flash_attn_func  # type: ignore[attr-defined]
    sys.modules["flash_attn"] = flash
    for pkg in ("wan", "wan.modules"):  # skip the package __init__s (text encoders, 14B pipelines)
        m = types.ModuleType(pkg)
        m.__path__ = [str(mg2 / pkg.replace(".", "/"))]  # type: ignore[attr-defined]
        sys.modules[pkg] = m
    tok = types.ModuleType("wan.modules.tokenizers")
    tok.HuggingfaceTokenizer = None  # type: ignore[attr-defined]
    sys.modules["wan.modules.tokenizers"] = tok
    vis = types.ModuleType("utils.visualize")
    vis.process_video = None  # type: ignore[attr-defined]
    sys.modules["utils.visualize"] = vis
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    import wan.modules.causal_model as causal_model
    import wan.modules.model as model
    from pipeline.causal_inference import CausalInferencePipeline
    from utils.wan_wrapper import WanDiffusionWrapper

    causal_model.attention = _stub_attention
    model.flash_attention = _stub_attention
    return types.SimpleNamespace(pipeline=CausalInferencePipeline, wrapper=WanDiffusionWrapper, path=mg2)


def _commit(root: Path) -> str:
    env = os.environ.get("MATRIX_GAME_REF_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        raise SystemExit(f"{root} is not a git checkout: set MATRIX_GAME_REF_COMMIT to its commit") from e


def _actions(g: torch.Generator, pixel_frames: int, dim: int, *, one_hot: bool) -> torch.Tensor:
    """(1, P, dim) keyboard rows that change every 1..6 pixel frames (multi-hot, or one-hot)."""
    rows = torch.zeros(pixel_frames, dim)
    p = 0
    while p < pixel_frames:
        n = int(torch.randint(1, 7, (1,), generator=g))
        if one_hot:
            v = torch.zeros(dim)
            v[int(torch.randint(0, dim, (1,), generator=g))] = 1.0
        else:
            v = (torch.rand(dim, generator=g) < 0.4).to(torch.float64)
        rows[p:p + n] = v
        p += n
    return rows[None]


def _mouse(g: torch.Generator, pixel_frames: int) -> torch.Tensor:
    """(1, P, 2) camera deltas in [-0.1, 0.1] that change every 1..6 pixel frames, on a 1/1024 grid
    (exact in float32, the dtype our engine carries actions in)."""
    rows = torch.zeros(pixel_frames, 2)
    p = 0
    while p < pixel_frames:
        n = int(torch.randint(1, 7, (1,), generator=g))
        rows[p:p + n] = torch.round((torch.rand(2, generator=g) * 2 - 1) * 0.1 * 1024) / 1024
        p += n
    return rows[None]


def make(name: str, ref: types.SimpleNamespace, commit: str) -> Path:
    cfg, run = FIXTURE_CONFIGS[name], FIXTURE_RUNS[name]
    a = cfg["action_config"]
    h, w = run["latent_hw"]
    T = (h // 2) * (w // 2)
    Fl, K, L = run["latent_frames"], run["cond_latent_frames"], run["image_tokens"]
    P = 1 + 4 * (Fl - 1)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(cfg))
        gen = ref.wrapper(model_config=d, timestep_shift=run["model_kwargs"]["timestep_shift"], is_causal=True)
    shapes = {"model." + k: tuple(v.shape) for k, v in gen.model.state_dict().items()}
    with torch.no_grad():
        weights = seeded_state(shapes, seed=run["weight_seed"])
        gen.load_state_dict(weights, strict=True)
    for blk in gen.model.blocks:  # the release hard-codes 880 tokens per frame here
        blk.self_attn.max_attention_size = cfg["local_attn_size"] * T
    args = types.SimpleNamespace(**{k: run[k] for k in ("denoising_step_list", "warp_denoising_step",
                                                        "num_frame_per_block", "context_noise")})
    pipe = ref.pipeline(args, generator=gen, vae_decoder=lambda x, *cache: (x, list(cache)))
    pipe.frame_seq_length = T
    pipe.num_transformer_blocks = cfg["num_layers"]
    heads, hd = cfg["num_heads"], cfg["dim"] // cfg["num_heads"]
    ah, ad = a["heads_num"], a["keyboard_hidden_dim"] // a["heads_num"]

    def ring(b: int, size: int, hh: int, dd: int) -> dict:
        return {"k": torch.zeros([b, size, hh, dd]), "v": torch.zeros([b, size, hh, dd]),
                "global_end_index": torch.tensor([0], dtype=torch.long),
                "local_end_index": torch.tensor([0], dtype=torch.long)}

    def init_kv(self, batch_size, dtype, device):  # type: ignore[no-untyped-def]
        self.kv_cache1 = [ring(batch_size, self.local_attn_size * T, heads, hd) for _ in range(cfg["num_layers"])]

    def init_action(self, batch_size, dtype, device):  # type: ignore[no-untyped-def]
        self.kv_cache_keyboard = [ring(batch_size, self.local_attn_size, ah, ad) for _ in range(cfg["num_layers"])]
        self.kv_cache_mouse = [ring(batch_size * T, self.local_attn_size, ah, ad) for _ in range(cfg["num_layers"])]

    def init_cross(self, batch_size, dtype, device):  # type: ignore[no-untyped-def]
        self.crossattn_cache = [{"k": None, "v": None, "is_init": False} for _ in range(cfg["num_layers"])]

    pipe._initialize_kv_cache = types.MethodType(init_kv, pipe)
    pipe._initialize_kv_cache_mouse_and_keyboard = types.MethodType(init_action, pipe)
    pipe._initialize_crossattn_cache = types.MethodType(init_cross, pipe)

    g = torch.Generator().manual_seed(run["input_seed"])
    image_latent = torch.randn(1, 16, K, h, w, generator=g)
    frames = [image_latent[:, :, min(j, K - 1)] for j in range(Fl)]  # frames past K reuse the last
    img_cond = torch.stack(frames, dim=2)  # (1, 16, Fl, h, w)
    mask = torch.ones_like(img_cond)
    mask[:, :, 1:] = 0
    cond_concat = torch.cat([mask[:, :4], img_cond], dim=1)  # the release's construction (inference.py)
    visual_context = torch.randn(1, L, 1280, generator=g)
    keyboard = _actions(g, P, a["keyboard_dim_in"], one_hot=not a["enable_mouse"])
    cond = {"cond_concat": cond_concat, "visual_context": visual_context, "keyboard_cond": keyboard}
    if a["enable_mouse"]:
        cond["mouse_cond"] = _mouse(g, P)
    noise = torch.randn(1, 16, Fl, h, w, generator=g)

    calls: list[dict] = []

    def record(module, args, kwargs, output):  # type: ignore[no-untyped-def]
        calls.append({"x_t": kwargs["noisy_image_or_video"].clone(), "t": kwargs["timestep"].clone(),
                      "start": kwargs["current_start"], "flow": output[0].clone(), "x0": output[1].clone()})

    gen.register_forward_hook(record, with_kwargs=True)
    torch.manual_seed(run["input_seed"] + 1)  # the pipeline's fresh noise between steps (torch.randn_like)
    with torch.no_grad():
        latents = pipe.inference(noise=noise, conditional_dict=cond, return_latents=True,
                                 mode="universal" if a["enable_mouse"] else "templerun")

    tensors: dict[str, torch.Tensor] = {"image_latent": image_latent, "visual_context": visual_context,
                                        "keyboard_cond": keyboard}
    if a["enable_mouse"]:
        tensors["mouse_cond"] = cond["mouse_cond"]
    steps = len(run["denoising_step_list"])
    denoise_calls = [c for n, c in enumerate(calls) if n % (steps + 1) < steps]  # the commit passes re-run x0
    for n, c in enumerate(denoise_calls):
        for key in ("x_t", "t", "x0"):
            tensors[f"call.{n}.{key}"] = c[key]
    window = cfg["local_attn_size"] - run["num_frame_per_block"]  # what later chunks can still see

    def newest(c: dict, per_frame: int) -> tuple[torch.Tensor, torch.Tensor]:
        e = int(c["local_end_index"])
        return c["k"][:, e - window * per_frame:e], c["v"][:, e - window * per_frame:e]

    for i in range(cfg["num_layers"]):
        tensors[f"cache.kv.{i}.k"], tensors[f"cache.kv.{i}.v"] = newest(pipe.kv_cache1[i], T)
        if i in a["blocks"]:
            tensors[f"cache.keyboard.{i}.k"], tensors[f"cache.keyboard.{i}.v"] = newest(pipe.kv_cache_keyboard[i], 1)
            if a["enable_mouse"]:
                tensors[f"cache.mouse.{i}.k"], tensors[f"cache.mouse.{i}.v"] = newest(pipe.kv_cache_mouse[i], 1)
    _ = latents  # equal to each chunk's last x0
    meta = {
        "reference": "SkyworkAI/Matrix-Game, Matrix-Game-2 (pipeline/causal_inference.py CausalInferencePipeline)",
        "reference_commit": commit,
        "torch": torch.__version__,
        "config": json.dumps(cfg),
        "run": json.dumps(run),
        "calls": json.dumps([{"start": c["start"]} for c in denoise_calls]),
        "cache_frames": f"the last {window} committed latent frames of each cache (local_attn_size - chunk)",
        "weights": "tiny_weights.seeded_state over the release keys below, seed run.weight_seed",
        "keys": json.dumps({k: list(v) for k, v in shapes.items()}),
        "stubs": "flash-attn -> SDPA fp64; cuda device -> cpu; Tensor.float -> float64; cache initialisers and "
                 "880-token constants -> tiny sizes; python -O (asserts hard-coding 880); VAE decoder no-op",
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    return path


def main() -> None:
    root = os.environ.get("MATRIX_GAME_REF")
    if not root:
        raise SystemExit(__doc__)
    if __debug__:
        raise SystemExit("run with python -O: the release asserts 880 tokens per frame in its action module")
    rootp = Path(root).resolve()
    commit = _commit(rootp)
    torch.set_default_dtype(torch.float64)
    to_double = torch.Tensor.double
    torch.Tensor.float = lambda self, *a, **k: to_double(self)  # type: ignore[method-assign]
    ref = _import_reference(rootp)
    for name in FIXTURE_CONFIGS:
        path = make(name, ref, commit)
        print(f"{path} ({path.stat().st_size} bytes), reference {commit}")


if __name__ == "__main__":
    main()
