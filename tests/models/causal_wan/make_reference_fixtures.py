"""Regenerate the committed reference fixtures of the causal Wan parity tests from the references' own code.

    WAN_REF_SELF_FORCING=/path/Self-Forcing WAN_REF_CAUSVID=/path/CausVid WAN_REF_LONGLIVE=/path/LongLive \\
    PYTHONPATH=/path/with/peft:einops \\
    python -m tests.models.causal_wan.make_reference_fixtures [--only self_forcing,causvid,longlive,wan_vae,wan_t5]

Checkouts (fetch them; nothing here downloads anything): guandeh17/Self-Forcing, tianweiy/CausVid and
NVlabs/LongLive at its LongLive 1.0 commit (2462895, the last before "LongLive 2.0"; later commits are a
Wan 2.2 5B model). Each reference runs in its own child process (they all name their packages `wan`,
`utils`, `pipeline`), on seeded tiny float64 weights, and writes `fixtures/<name>.safetensors` (inputs,
weights, noise draws, outputs) and `fixtures/<name>.json` (the reference's commit, the settings, what
was stubbed). The tests (`test_reference_parity.py`) read only those files.

What runs is the references' own code: their `CausalWanModel` with its KV-cache branch, their
inference pipelines' loops (`CausalInferencePipeline.inference`, CausVid's `InferencePipeline.inference`,
LongLive's `InteractiveCausalInferencePipeline.inference` with `_recache_after_switch`), their
`FlowMatchScheduler`, their diffusion wrappers' x0 conversion, LongLive's PEFT LoRA wrapping
(`configure_lora_for_model`, `peft.set_peft_model_state_dict`), Wan's VAE decoder and umT5 encoder.
Stubbed, because they cannot run on a CPU or are sized for the full model only:
- flash-attn: `wan.modules.attention.attention` / `flash_attention` -> plain softmax attention
  (`F.scaled_dot_product_attention`) in the inputs' dtype (their own fallback casts to bf16);
- float32 islands written for bf16 weights (`x.float()` in their norms and softmax) stay float64
  (`Tensor.float` leaves float64 alone while a reference runs; `refs.lifted_fp32_casts`);
- constants of the 480x832 1.3B model: 1560 tokens per frame (`frame_seq_length`, `max_attention_size`),
  30 blocks, KV caches of (B, tokens, 12, 128) and 32760 tokens (= the 21-frame horizon): replaced by the
  tiny frame's token count, 2 blocks, (B, tokens, 2, 12) and 21 frames' worth of tokens;
- `device="cuda"` literals (CausVid's loop) -> the CPU; `utils.memory` / `demo_utils.memory` (GPU
  helpers probing `torch.cuda` at import) -> CPU stand-ins; `torch.cuda.current_device()` (a default
  argument evaluated at import) -> 0; `ftfy` (prompt cleaning, unused) -> identity;
- the text encoder and VAE of the pipelines -> stand-ins returning seeded prompt embeddings and the
  latents (the umT5 and VAE parity have their own fixtures);
- `torch.randn_like` (the fresh noise between steps) draws from a seeded generator and records the draws.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from tests.models.causal_wan.refs import lifted_fp32_casts

FIXTURES = Path(__file__).parent / "fixtures"

#: The tiny network every DiT fixture uses (our `tiny()` sizes), and its latent frame.
NET = dict(dim=24, ffn_dim=48, freq_dim=32, text_dim=16, num_heads=2, num_layers=2, in_dim=4, out_dim=4, text_len=16)
LATENT = (4, 8, 8)  # (C, h, w): 4 x 4 = 16 tokens per frame
T = (LATENT[1] // 2) * (LATENT[2] // 2)
HORIZON = 21  # Self-Forcing / CausVid: 21 latent frames (their 32760-token cache at 1560 tokens per frame)
PROMPT_TOKENS = 10  # prompt embeddings shorter than text_len: the padding is exercised
WEIGHT_SCALE = 0.3

ENV = {"self_forcing": "WAN_REF_SELF_FORCING", "causvid": "WAN_REF_CAUSVID", "longlive": "WAN_REF_LONGLIVE",
       "wan_vae": "WAN_REF_SELF_FORCING", "wan_t5": "WAN_REF_SELF_FORCING"}  # fmt: skip


# -----------------------------------------------------------------------------
# stubs and helpers (child process)


def _pkg(name: str, path: Path) -> types.ModuleType:
    """A package whose `__init__` is not run (theirs import training code, GPUs, sdxl, ...)."""
    m = types.ModuleType(name)
    m.__path__ = [str(path)]
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    sys.modules[name] = m
    return m


def _module(name: str, **attrs: object) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package="__path__" in attrs)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: object = None,
                    k_lens: object = None, dropout_p: float = 0.0, softmax_scale: object = None,
                    q_scale: object = None, causal: bool = False, window_size: object = (-1, -1),
                    deterministic: bool = False, dtype: object = None, version: object = None,
                    fa_version: object = None) -> torch.Tensor:
    """flash-attn's contract ((B, L, H, D) in and out), computed by plain softmax attention in q's dtype."""
    assert q_lens is None and k_lens is None and not causal and softmax_scale is None and q_scale is None
    assert dropout_p == 0.0
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def _patch_attention(mods: list[types.ModuleType]) -> None:
    for m in mods:
        for name in ("attention", "flash_attention"):
            if hasattr(m, name):
                setattr(m, name, plain_attention)


def _common_stubs() -> dict[str, object]:
    _module("ftfy", fix_text=lambda s: s)
    torch.cuda.current_device = lambda: 0  # evaluated in default arguments at import (wan/modules/t5.py)
    cpu = torch.device("cpu")
    mem = dict(gpu=cpu, cpu=cpu, get_cuda_free_memory_gb=lambda *a, **k: 0.0, DynamicSwapInstaller=object,
               move_model_to_device_with_memory_preservation=lambda *a, **k: None,
               log_gpu_memory=lambda *a, **k: None, gpu_complete_modules=[])
    return mem


def randomize(module: torch.nn.Module, seed: int, scale: float = WEIGHT_SCALE) -> None:
    """Every parameter := seeded N(0, scale^2), in name order (float64)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale)


class Draws:
    """Stands in for torch.randn_like during a reference run: seeded draws, recorded in order."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.out: list[torch.Tensor] = []

    def __call__(self, like: torch.Tensor, **kw: object) -> torch.Tensor:
        x = torch.randn(like.shape, generator=self.g, dtype=like.dtype)
        self.out.append(x.clone())
        return x


@contextlib.contextmanager
def recorded_noise(draws: Draws) -> Iterator[None]:
    orig = torch.randn_like
    torch.randn_like = draws  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.randn_like = orig  # type: ignore[assignment]


class PromptTable:
    """The pipelines' text encoder stand-in: prompt text -> seeded embeddings (B, PROMPT_TOKENS, text_dim)."""

    def __init__(self, prompts: list[str], seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = {p: torch.randn(1, PROMPT_TOKENS, NET["text_dim"], generator=g, dtype=torch.float64)
                      for p in prompts}

    def __call__(self, text_prompts: list[str]) -> dict[str, torch.Tensor]:
        return {"prompt_embeds": torch.cat([self.table[p] for p in text_prompts])}


class LatentsOut:
    """The pipelines' VAE stand-in: `decode_to_pixel` hands the latents back (VAE parity is its own fixture)."""

    def decode_to_pixel(self, latent: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        return latent


def _tiny_caches(pipeline: object, *, heads: int, head_dim: int, layers: int, default_frames: int) -> None:
    """The pipelines' cache allocators with the tiny model's shapes (theirs hard-code 12 x 128 heads)."""

    def kv(self, batch_size, dtype, device, kv_cache_size_override=None):  # type: ignore[no-untyped-def]
        size = kv_cache_size_override
        if size is None:
            la = getattr(self, "local_attn_size", -1)
            size = (la if la != -1 else default_frames) * self.frame_seq_length
        self.kv_cache1 = [{"k": torch.zeros(batch_size, size, heads, head_dim, dtype=dtype, device=device),
                           "v": torch.zeros(batch_size, size, heads, head_dim, dtype=dtype, device=device),
                           "global_end_index": torch.tensor([0], dtype=torch.long, device=device),
                           "local_end_index": torch.tensor([0], dtype=torch.long, device=device)}
                          for _ in range(layers)]

    def cross(self, batch_size, dtype, device):  # type: ignore[no-untyped-def]
        self.crossattn_cache = [{"k": torch.zeros(batch_size, NET["text_len"], heads, head_dim, dtype=dtype),
                                 "v": torch.zeros(batch_size, NET["text_len"], heads, head_dim, dtype=dtype),
                                 "is_init": False} for _ in range(layers)]

    object.__setattr__(pipeline, "_initialize_kv_cache", types.MethodType(kv, pipeline))
    object.__setattr__(pipeline, "_initialize_crossattn_cache", types.MethodType(cross, pipeline))
    pipeline.num_transformer_blocks = layers  # type: ignore[attr-defined]
    pipeline.frame_seq_length = T  # type: ignore[attr-defined]


def _git_commit(path: Path) -> str:
    """The checkout's commit: `<its env variable>_COMMIT` if set (an exported tree), else `git rev-parse HEAD`."""
    for env in set(ENV.values()):
        if os.environ.get(env) == str(path) and os.environ.get(env + "_COMMIT"):
            return os.environ[env + "_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"{path} is not a git checkout: set its WAN_REF_..._COMMIT variable") from None


def _write(name: str, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    FIXTURES.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(FIXTURES / f"{name}.safetensors"))
    meta = {**meta, "made": datetime.date.today().isoformat(), "torch": torch.__version__,
            "script": "tests/models/causal_wan/make_reference_fixtures.py"}
    (FIXTURES / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = (FIXTURES / f"{name}.safetensors").stat().st_size
    print(f"wrote fixtures/{name}.safetensors ({size / 1024:.0f} KiB) and .json", flush=True)


def _dit_kwargs(local_attn_size: int, sink_size: int) -> dict:
    return dict(model_type="t2v", patch_size=(1, 2, 2), text_len=NET["text_len"], in_dim=NET["in_dim"],
                dim=NET["dim"], ffn_dim=NET["ffn_dim"], freq_dim=NET["freq_dim"], text_dim=NET["text_dim"],
                out_dim=NET["out_dim"], num_heads=NET["num_heads"], num_layers=NET["num_layers"],
                local_attn_size=local_attn_size, sink_size=sink_size, qk_norm=True, cross_attn_norm=True, eps=1e-6)


def _set_max_attention(model: torch.nn.Module, frames: int) -> None:
    """`max_attention_size` (theirs: frames x 1560) at the tiny frame's token count."""
    for m in model.modules():
        if hasattr(m, "max_attention_size"):
            m.max_attention_size = frames * T


# -----------------------------------------------------------------------------
# Self-Forcing


def _self_forcing_imports(ref: Path) -> dict[str, types.ModuleType]:
    sys.path.insert(0, str(ref))
    mem = _common_stubs()
    _pkg("wan", ref / "wan")
    _pkg("wan.modules", ref / "wan" / "modules")
    _pkg("pipeline", ref / "pipeline")
    _pkg("utils", ref / "utils")
    _pkg("demo_utils", ref / "demo_utils")
    _module("demo_utils.memory", **mem)
    mods = {n: importlib.import_module(n) for n in ("wan.modules.attention", "wan.modules.model",
                                                     "wan.modules.causal_model", "utils.wan_wrapper",
                                                     "utils.scheduler", "pipeline.causal_inference")}
    _patch_attention([mods["wan.modules.attention"], mods["wan.modules.model"], mods["wan.modules.causal_model"]])
    return mods


def _sf_wrapper(mods: dict, model: torch.nn.Module, shift: float) -> torch.nn.Module:
    """Self-Forcing's WanDiffusionWrapper(is_causal=True) around `model` (its __init__ loads files)."""
    W = mods["utils.wan_wrapper"].WanDiffusionWrapper
    gen = W.__new__(W)
    torch.nn.Module.__init__(gen)
    gen.model = model.eval()
    gen.uniform_timestep = False
    gen.scheduler = mods["utils.scheduler"].FlowMatchScheduler(shift=shift, sigma_min=0.0, extra_one_step=True)
    gen.scheduler.set_timesteps(1000, training=True)
    gen.seq_len = 32760
    gen.post_init()
    return gen


def run_self_forcing(ref: Path, *, rolling: bool) -> None:
    """Self-Forcing's CausalInferencePipeline: 7 chunks of global attention over its 21-frame horizon, or
    (rolling) its own rolling-cache branch with local_attn_size 21, sink 0, over 10 chunks (30 frames)."""
    mods = _self_forcing_imports(ref)
    la, chunks = (HORIZON, 10) if rolling else (-1, 7)
    with lifted_fp32_casts():
        model = mods["wan.modules.causal_model"].CausalWanModel(**_dit_kwargs(la, 0)).double()
        randomize(model, seed=101)
        _set_max_attention(model, HORIZON)  # theirs: 32760 = 21 x 1560 (global) or 21 x 1560 (local 21)
        gen = _sf_wrapper(mods, model, shift=5.0)
        args = types.SimpleNamespace(denoising_step_list=[1000, 750, 500, 250], warp_denoising_step=True,
                                     num_frame_per_block=3, independent_first_frame=False, context_noise=0,
                                     model_kwargs={})
        prompts = PromptTable(["p0"], seed=102)
        pipe = mods["pipeline.causal_inference"].CausalInferencePipeline(args, "cpu", generator=gen,
                                                                         text_encoder=prompts, vae=LatentsOut())
        _tiny_caches(pipe, heads=NET["num_heads"], head_dim=NET["dim"] // NET["num_heads"], layers=NET["num_layers"],
                     default_frames=HORIZON)
        g = torch.Generator().manual_seed(103)
        noise = torch.randn(1, 3 * chunks, *LATENT, generator=g, dtype=torch.float64)
        draws = Draws(104)
        with torch.no_grad(), recorded_noise(draws):
            _, out = pipe.inference(noise=noise, text_prompts=["p0"], return_latents=True)
    name = "self_forcing_rolling" if rolling else "self_forcing"
    tensors = {"noise": noise, "draws": torch.stack(draws.out), "output": out, "context.0": prompts.table["p0"]}
    tensors.update({f"weights.{k}": v for k, v in model.state_dict().items()})
    _write(name, tensors, {
        "reference": "guandeh17/Self-Forcing", "commit": _git_commit(ref), "preset": "self-forcing",
        "ran": "pipeline/causal_inference.py CausalInferencePipeline.inference over wan/modules/causal_model.py "
               "CausalWanModel (KV-cache branch)" + (", its rolling-cache path" if rolling else ""),
        "local_attn_size": la, "sink_size": 0, "chunks": chunks, "frames_per_chunk": 3, "tokens_per_frame": T,
        "kv_cache_frames": HORIZON, "denoising_step_list": [float(t) for t in pipe.denoising_step_list],
        "timestep_shift": 5.0, "warp_denoising_step": True, "context_noise": 0, "net": NET, "latent": LATENT,
        "weight_scale": WEIGHT_SCALE, "stubs": STUBS,
    })


# -----------------------------------------------------------------------------
# CausVid


def run_causvid(ref: Path) -> None:
    """CausVid's InferencePipeline (configs/wan_causal_dmd.yaml): 7 chunks, steps 1000/757/522, shift 8."""
    sys.path.insert(0, str(ref))
    _common_stubs()
    holder: dict[str, object] = {}
    _pkg("causvid", ref / "causvid")
    _module("causvid.models", __path__=[str(ref / "causvid" / "models")],
            get_diffusion_wrapper=lambda model_name: (lambda: holder["generator"]),
            get_text_encoder_wrapper=lambda model_name: (lambda: holder["text"]),
            get_vae_wrapper=lambda model_name: (lambda: holder["vae"]))
    _pkg("causvid.models.wan", ref / "causvid" / "models" / "wan")
    _pkg("causvid.models.wan.wan_base", ref / "causvid" / "models" / "wan" / "wan_base")
    _pkg("causvid.models.wan.wan_base.modules", ref / "causvid" / "models" / "wan" / "wan_base" / "modules")
    names = ("causvid.models.wan.wan_base.modules.attention", "causvid.models.wan.wan_base.modules.model",
             "causvid.models.wan.causal_model", "causvid.models.wan.wan_wrapper", "causvid.models.wan.flow_match",
             "causvid.models.wan.causal_inference")
    mods = {n: importlib.import_module(n) for n in names}
    _patch_attention([mods[names[0]], mods[names[1]], mods[names[2]]])
    ci = mods["causvid.models.wan.causal_inference"]

    class _CpuTorch(types.ModuleType):
        """CausVid's loop builds `torch.ones(..., device="cuda")`: the same call on the CPU."""

        def __getattr__(self, name: str) -> object:
            return getattr(torch, name)

        @staticmethod
        def ones(*a: object, **kw: object) -> torch.Tensor:
            kw.pop("device", None)
            return torch.ones(*a, **kw)  # type: ignore[call-overload]

    ci.torch = _CpuTorch("torch")
    with lifted_fp32_casts():
        model = mods["causvid.models.wan.causal_model"].CausalWanModel(**{
            k: v for k, v in _dit_kwargs(-1, 0).items() if k not in ("local_attn_size", "sink_size")}).double()
        randomize(model, seed=201)
        W = mods["causvid.models.wan.wan_wrapper"].CausalWanDiffusionWrapper
        gen = W.__new__(W)
        torch.nn.Module.__init__(gen)
        gen.model = model.eval()
        gen.uniform_timestep = False
        gen.scheduler = mods["causvid.models.wan.flow_match"].FlowMatchScheduler(shift=8.0, sigma_min=0.0,
                                                                                  extra_one_step=True)
        gen.scheduler.set_timesteps(1000, training=True)
        gen.seq_len = 32760
        gen.post_init()
        prompts = PromptTable(["p0"], seed=202)
        holder.update(generator=gen, text=prompts, vae=LatentsOut())
        args = types.SimpleNamespace(model_name="causal_wan", generator_name="causal_wan",
                                     denoising_step_list=[1000, 757, 522, 0], warp_denoising_step=False,
                                     num_frame_per_block=3)
        pipe = ci.InferencePipeline(args, device="cpu")
        _tiny_caches(pipe, heads=NET["num_heads"], head_dim=NET["dim"] // NET["num_heads"], layers=NET["num_layers"],
                     default_frames=HORIZON)  # theirs: 32760 tokens = 21 frames at 1560
        g = torch.Generator().manual_seed(203)
        noise = torch.randn(1, 3 * 7, *LATENT, generator=g, dtype=torch.float64)
        draws = Draws(204)
        with torch.no_grad(), recorded_noise(draws):
            _, out = pipe.inference(noise=noise, text_prompts=["p0"], return_latents=True)
    tensors = {"noise": noise, "draws": torch.stack(draws.out), "output": out, "context.0": prompts.table["p0"]}
    tensors.update({f"weights.{k}": v for k, v in model.state_dict().items()})
    _write("causvid", tensors, {
        "reference": "tianweiy/CausVid", "commit": _git_commit(ref), "preset": "causvid",
        "ran": "causvid/models/wan/causal_inference.py InferencePipeline.inference over causvid/models/wan/"
               "causal_model.py CausalWanModel (KV-cache branch), CausalWanDiffusionWrapper",
        "local_attn_size": -1, "sink_size": 0, "chunks": 7, "frames_per_chunk": 3, "tokens_per_frame": T,
        "kv_cache_frames": HORIZON, "denoising_step_list": [float(t) for t in pipe.denoising_step_list],
        "timestep_shift": 8.0, "warp_denoising_step": False, "context_noise": 0, "net": NET, "latent": LATENT,
        "weight_scale": WEIGHT_SCALE, "stubs": STUBS,
    })


# -----------------------------------------------------------------------------
# LongLive 1.0


class AttrDict(dict):
    """OmegaConf's attribute-and-key access, for the adapter config."""

    def __getattr__(self, name: str) -> object:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


LORA_RANK, LORA_ALPHA = 4, 8.0  # scale alpha / r = 2 (LongLive 1.0's release: 256 / 256 = 1)
SWITCHES = [6, 21]  # a switch within the first window (sinks re-run) and one in steady state


def run_longlive(ref: Path) -> None:
    """LongLive 1.0's InteractiveCausalInferencePipeline: window 12, 3 sinks, global sink, a LoRA, 10 chunks,
    prompt switches at latent frames 6 and 21 (`_recache_after_switch`)."""
    sys.path.insert(0, str(ref))
    mem = _common_stubs()
    _pkg("wan", ref / "wan")
    _pkg("wan.modules", ref / "wan" / "modules")
    _pkg("pipeline", ref / "pipeline")
    _pkg("utils", ref / "utils")
    _module("utils.memory", **mem)
    import peft

    names = ("wan.modules.attention", "wan.modules.model", "wan.modules.causal_model", "utils.wan_wrapper",
             "utils.scheduler", "utils.lora_utils", "pipeline.interactive_causal_inference")
    mods = {n: importlib.import_module(n) for n in names}
    _patch_attention([mods["wan.modules.attention"], mods["wan.modules.model"], mods["wan.modules.causal_model"]])
    with lifted_fp32_casts():
        model = mods["wan.modules.causal_model"].CausalWanModel(**_dit_kwargs(12, 3)).double()
        randomize(model, seed=301)
        base = {k: v.clone() for k, v in model.state_dict().items()}
        W = mods["utils.wan_wrapper"].WanDiffusionWrapper
        gen = W.__new__(W)
        torch.nn.Module.__init__(gen)
        gen.model = model.eval()
        gen.uniform_timestep = False
        gen.scheduler = mods["utils.scheduler"].FlowMatchScheduler(shift=5.0, sigma_min=0.0, extra_one_step=True)
        gen.scheduler.set_timesteps(1000, training=True)
        gen.seq_len = 32760
        gen.post_init()
        # the LoRA, as LongLive's inference.py applies it: wrap, then load a (here: seeded random) state dict
        adapter = AttrDict(type="lora", rank=LORA_RANK, alpha=LORA_ALPHA, dropout=0.0, verbose=False)
        gen.model = mods["utils.lora_utils"].configure_lora_for_model(gen.model, model_name="generator",
                                                                      lora_config=adapter, is_main_process=False)
        keys = peft.get_peft_model_state_dict(gen.model)
        g = torch.Generator().manual_seed(302)
        lora = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) * 0.1 for k, v in sorted(keys.items())}
        peft.set_peft_model_state_dict(gen.model, lora)
        gen.model = gen.model.double().eval()
        prompts = PromptTable(["p0", "p1", "p2"], seed=303)
        args = types.SimpleNamespace(denoising_step_list=[1000, 750, 500, 250], warp_denoising_step=True,
                                     num_frame_per_block=3, model_kwargs=types.SimpleNamespace(local_attn_size=12,
                                     timestep_shift=5.0, sink_size=3), context_noise=0, global_sink=True)
        pipe = mods["pipeline.interactive_causal_inference"].InteractiveCausalInferencePipeline(
            args, "cpu", generator=gen, text_encoder=prompts, vae=LatentsOut())
        _tiny_caches(pipe, heads=NET["num_heads"], head_dim=NET["dim"] // NET["num_heads"], layers=NET["num_layers"],
                     default_frames=12)
        noise = torch.randn(1, 30, *LATENT, generator=torch.Generator().manual_seed(304), dtype=torch.float64)
        draws = Draws(305)
        with torch.no_grad(), recorded_noise(draws):
            _, out = pipe.inference(noise, text_prompts_list=[["p0"], ["p1"], ["p2"]],
                                    switch_frame_indices=SWITCHES, return_latents=True)
    tensors = {"noise": noise, "draws": torch.stack(draws.out), "output": out}
    tensors.update({f"context.{i}": prompts.table[f"p{i}"] for i in range(3)})
    tensors.update({f"weights.{k}": v for k, v in base.items()})
    tensors.update({f"lora.{k}": v for k, v in lora.items()})
    _write("longlive", tensors, {
        "reference": "NVlabs/LongLive (LongLive 1.0)", "commit": _git_commit(ref), "preset": "longlive",
        "ran": "pipeline/interactive_causal_inference.py InteractiveCausalInferencePipeline.inference "
               "(_recache_after_switch, global_sink true) over wan/modules/causal_model.py CausalWanModel "
               "(KV-cache branch), utils/lora_utils.py configure_lora_for_model + peft.set_peft_model_state_dict",
        "peft": peft.__version__, "local_attn_size": 12, "sink_size": 3, "chunks": 10, "frames_per_chunk": 3,
        "tokens_per_frame": T, "switch_frame_indices": SWITCHES, "lora_rank": LORA_RANK, "lora_alpha": LORA_ALPHA,
        "denoising_step_list": [float(t) for t in pipe.denoising_step_list], "timestep_shift": 5.0,
        "warp_denoising_step": True, "context_noise": 0, "net": NET, "latent": LATENT,
        "weight_scale": WEIGHT_SCALE, "stubs": STUBS,
    })


# -----------------------------------------------------------------------------
# Wan's own VAE decoder and umT5 encoder (the files Self-Forcing reads)

VAE_NET = dict(dim=4, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
               temperal_downsample=[False, True, True], dropout=0.0)
VAE_MEAN, VAE_STD = [0.1, -0.2, 0.3, 0.0], [1.5, 0.5, 2.0, 1.0]
T5_NET = dict(vocab=64, dim=16, dim_attn=16, dim_ffn=32, num_heads=2, num_layers=2, num_buckets=8, shared_pos=False,
              dropout=0.0)


def run_wan_vae(ref: Path) -> None:
    """Wan 2.1's WanVAE_.decode (Self-Forcing's copy of wan/modules/vae.py) on 5 latent frames, clamped as
    their WanVAEWrapper.decode_to_pixel does."""
    sys.path.insert(0, str(ref))
    _common_stubs()
    _pkg("wan", ref / "wan")
    _pkg("wan.modules", ref / "wan" / "modules")
    vae_mod = importlib.import_module("wan.modules.vae")
    with lifted_fp32_casts():
        vae = vae_mod.WanVAE_(**VAE_NET).double().eval()
        randomize(vae, seed=401, scale=0.2)
        z = torch.randn(1, 4, 5, 4, 4, generator=torch.Generator().manual_seed(402), dtype=torch.float64)
        mean, std = torch.tensor(VAE_MEAN, dtype=torch.float64), torch.tensor(VAE_STD, dtype=torch.float64)
        with torch.no_grad():
            out = vae.decode(z, [mean, 1.0 / std]).float().clamp_(-1, 1)
    clamped = float((out.abs() == 1).double().mean())
    dec = {k: v for k, v in vae.state_dict().items() if not k.startswith(("encoder.", "conv1."))}  # decoding half
    tensors = {"z": z, "output": out, **{f"weights.{k}": v for k, v in dec.items()}}
    _write("wan_vae", tensors, {
        "reference": "guandeh17/Self-Forcing (wan/modules/vae.py, Wan 2.1's VAE)", "commit": _git_commit(ref),
        "ran": "WanVAE_.decode(z, [mean, 1 / std]), then .clamp(-1, 1) (utils/wan_wrapper.py WanVAEWrapper)",
        "net": VAE_NET, "latents_mean": VAE_MEAN, "latents_std": VAE_STD, "clamped_fraction": clamped,
        "stubs": ["float32 islands kept float64 (Tensor.float lifted)"],
    })


def run_wan_t5(ref: Path) -> None:
    """Wan's umT5 T5Encoder (wan/modules/t5.py) on a padded batch of token ids."""
    sys.path.insert(0, str(ref))
    _common_stubs()
    _pkg("wan", ref / "wan")
    _pkg("wan.modules", ref / "wan" / "modules")
    t5 = importlib.import_module("wan.modules.t5")
    with lifted_fp32_casts():
        enc = t5.T5Encoder(**T5_NET).double().eval()
        randomize(enc, seed=501, scale=0.5)
        ids = torch.randint(1, T5_NET["vocab"], (2, 12), generator=torch.Generator().manual_seed(502))
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[1, 7:] = 0
        ids[1, 7:] = 0
        with torch.no_grad():
            out = enc(ids, mask)
    tensors = {"ids": ids, "mask": mask, "output": out, **{f"weights.{k}": v for k, v in enc.state_dict().items()}}
    _write("wan_t5", tensors, {
        "reference": "guandeh17/Self-Forcing (wan/modules/t5.py, Wan 2.1's umT5 encoder)", "commit": _git_commit(ref),
        "ran": "T5Encoder(ids, mask) (umt5_xxl's architecture at tiny sizes: shared_pos=False)", "net": T5_NET,
        "stubs": ["float32 islands kept float64 (Tensor.float lifted)"],
    })


STUBS = [" ".join(item.split()) for item in (__doc__ or "").split("Stubbed,")[1].split("\n- ")[1:]]
RUNS = {"self_forcing": lambda r: run_self_forcing(r, rolling=False),
        "self_forcing_rolling": lambda r: run_self_forcing(r, rolling=True), "causvid": run_causvid,
        "longlive": run_longlive, "wan_vae": run_wan_vae, "wan_t5": run_wan_t5}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(RUNS), help="comma-separated runs")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        env = ENV[a.child.removesuffix("_rolling")]
        RUNS[a.child](Path(os.environ[env]))
        return
    failed = []
    for name in a.only.split(","):
        env = ENV[name.removesuffix("_rolling")]
        if not os.environ.get(env):
            sys.exit(f"set {env} to a checkout of the reference for {name}")
        rc = subprocess.run([sys.executable, "-m", "tests.models.causal_wan.make_reference_fixtures", "--child",
                             name]).returncode
        if rc:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
