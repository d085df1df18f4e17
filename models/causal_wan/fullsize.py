"""The full-size check on a CPU: the real 1.3B architecture from generated checkpoints in every layout.

    python -m worldcast.models.causal_wan.fullsize            # `make fullsize-check`; ~10 GB of temp files
    python -m worldcast.models.causal_wan.fullsize --tiny     # the same steps at the tiny config (tests)

1. Writes random bf16 checkpoints of Wan 2.1 T2V 1.3B (30 blocks, width 1536) into a temporary folder
   (deleted afterwards unless --keep), in every layout the loader reads:
   - a diffusers folder: `transformer/` (two shards, diffusers' names, its config.json), `vae/`, a
     `text_encoder/` + `tokenizer/`;
   - Wan 2.1's release folder: `Wan2.1_VAE.pth` (Wan's decoder names), `models_t5_umt5-xxl-enc-bf16.pth`
     (Wan's umT5 names), `google/umt5-xxl/`, `config.json`;
   - Self-Forcing's `.pt` with `generator` and `generator_ema` (EMA keys with FSDP's prefix);
   - CausVid's `autoregressive_checkpoint/model.pt` and LongLive's `longlive_base.pt` (`generator` only)
     with LongLive's rank-256 `lora.pt` (PEFT names) beside it.
   The umT5 written is the XXL width (4096, what the DiT reads) with 1 layer and a byte vocabulary, not
   the 5.7 B XXL (11 GB); the XXL layout's key and shape coverage is checked on the meta device instead.
2. Key and shape coverage: every layout's names map onto our modules (the DiT, the VAE decoder, umT5-XXL
   built on the meta device), nothing missing, nothing left over, every shape equal.
3. Loads each DiT layout through the real loader (`load_parts` / `load_dit_pt`, the LoRA merged for
   LongLive), checks EMA and LoRA took effect, and runs one chunk of the full architecture in bf16 at
   a small resolution (4 denoising steps, the commit pass, the VAE decode) through the factory's model.
4. Prints one JSON object as its last line: `formats`, `params`, `state_bytes_per_session` at 480x832 by
   kind (per preset), `chunk_ms` (and the chunk's resolution).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from worldcast.models.causal_wan.checkpoints import read_pt, safetensors_shapes
from worldcast.models.causal_wan.config import CausalWanConfig, WanVAEConfig, tiny, wan_1_3b
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.keys import (
    diffusers_to_original,
    diffusers_to_wan_vae,
    original_to_diffusers,
    transformers_to_wan_t5,
    wan_t5_to_transformers,
    wan_vae_to_diffusers,
)
from worldcast.models.causal_wan.presets import PRESETS
from worldcast.models.causal_wan.sampler import generate_chunk
from worldcast.models.causal_wan.vae import WanVAEDecoder

log = logging.getLogger(__name__)

#: umT5-XXL (google/umt5-xxl, Wan's umt5_xxl): the layout checked on the meta device.
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                relative_attention_num_buckets=32, relative_attention_max_distance=128,
                feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0)
LORA_RANK = 256  #: LongLive 1.0's adapter rank


def meta_shapes(module_fn) -> dict[str, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    with torch.device("meta"):
        m = module_fn()
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


def random_state(shapes: dict[str, tuple[int, ...]], *, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Seeded N(0, 0.02^2) tensors of the given shapes (norm gains 1), one at a time."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, shape in shapes.items():
        if k.endswith(("norm3.weight", "norm_q.weight", "norm_k.weight", "gamma")) or "layer_norm" in k:
            out[k] = torch.ones(shape, dtype=dtype)
        else:
            out[k] = (torch.randn(shape, generator=g, dtype=torch.float32) * 0.02).to(dtype)
    return out


def coverage(theirs: dict[str, tuple[int, ...]], rename, ours: dict[str, tuple[int, ...]], what: str) -> int:  # type: ignore[no-untyped-def]
    """Check a layout's keys (renamed to ours) against our module's: returns the count, raises on a gap."""
    mapped: dict[str, tuple[int, ...]] = {}
    for k, shape in theirs.items():
        for name in ([rename(k)] if not isinstance(rename(k), list) else rename(k)):
            if name is not None:
                mapped[name] = shape
    missing, extra = sorted(set(ours) - set(mapped)), sorted(set(mapped) - set(ours))
    bad = [k for k in set(ours) & set(mapped) if ours[k] != mapped[k]]
    if missing or extra or bad:
        raise AssertionError(f"{what}: missing {missing[:5]}, unexpected {extra[:5]}, misshapen {bad[:5]}")
    log.info("fullsize: %s: %d keys, all mapped, all shapes equal", what, len(ours))
    return len(ours)


# -----------------------------------------------------------------------------
# writing the layouts


ALL_LAYOUTS = frozenset({"diffusers", "wan", "self-forcing", "causvid", "longlive"})


def write_layouts(root: Path, cfg: CausalWanConfig, *, dtype: torch.dtype, text_layers: int,
                  layouts: frozenset[str] = ALL_LAYOUTS) -> dict[str, Path]:
    """Every layout (or those in `layouts`) under `root`; returns {format name: the path a user passes as
    --weights (or as the base folder)}. "causvid" and "longlive" share one file (a symlink)."""
    from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

    t0 = time.perf_counter()
    dit_shapes = meta_shapes(lambda: CausalWanDiT(cfg))
    state = random_state(dit_shapes, seed=1, dtype=dtype)
    # diffusers folder: two shards, diffusers' names
    diff = root / "Wan2.1-T2V-1.3B-Diffusers"
    (diff / "transformer").mkdir(parents=True)
    names = sorted(state)
    half = len(names) // 2
    for i, part in enumerate((names[:half], names[half:]) if "diffusers" in layouts else ()):
        save_file({original_to_diffusers(k): state[k] for k in part},
                  str(diff / "transformer" / f"diffusion_pytorch_model-0000{i + 1}-of-00002.safetensors"))
    (diff / "transformer" / "config.json").write_text(json.dumps({
        "_class_name": "WanTransformer3DModel", "patch_size": list(cfg.patch), "num_attention_heads": cfg.heads,
        "attention_head_dim": cfg.head_dim, "in_channels": cfg.in_channels, "out_channels": cfg.out_channels,
        "text_dim": cfg.text_dim, "freq_dim": cfg.freq_dim, "ffn_dim": cfg.ffn_dim, "num_layers": cfg.layers,
        "cross_attn_norm": cfg.cross_attn_norm, "qk_norm": "rms_norm_across_heads", "eps": cfg.eps,
        "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024}))
    # the VAE (decoder side), both layouts
    v = cfg.vae
    vae_state = random_state(meta_shapes(lambda: WanVAEDecoder(v)), seed=2, dtype=dtype)
    (diff / "vae").mkdir()
    save_file(vae_state, str(diff / "vae" / "diffusion_pytorch_model.safetensors"))
    (diff / "vae" / "config.json").write_text(json.dumps({
        "_class_name": "AutoencoderKLWan", "base_dim": v.base_dim, "z_dim": v.z_dim, "dim_mult": list(v.dim_mult),
        "num_res_blocks": v.num_res_blocks, "attn_scales": [], "temperal_downsample": list(v.temporal_downsample),
        "latents_mean": list(v.latents_mean), "latents_std": list(v.latents_std)}))
    wan = root / "Wan2.1-T2V-1.3B"
    wan.mkdir()
    torch.save({diffusers_to_wan_vae(k, v): t for k, t in vae_state.items()}, wan / "Wan2.1_VAE.pth")
    (wan / "config.json").write_text(json.dumps({"_class_name": "WanModel", "dim": cfg.dim, "num_heads": cfg.heads,
                                                 "num_layers": cfg.layers, "ffn_dim": cfg.ffn_dim}))
    # umT5 at the DiT's text width, `text_layers` layers, ByT5's byte vocabulary (no tokenizer files needed)
    tok = ByT5Tokenizer()
    t5cfg = UMT5Config(**{**UMT5_XXL, "vocab_size": len(tok), "d_model": cfg.text_dim, "num_layers": text_layers,
                          "d_kv": cfg.text_dim // UMT5_XXL["num_heads"] if cfg.text_dim >= 4096 else 8,
                          "num_heads": UMT5_XXL["num_heads"] if cfg.text_dim >= 4096 else 2,
                          "d_ff": 10240 if cfg.text_dim >= 4096 else 2 * cfg.text_dim})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        t5 = UMT5EncoderModel(t5cfg).to(dtype)
    t5.save_pretrained(diff / "text_encoder")
    tok.save_pretrained(diff / "tokenizer")
    torch.save({w: t for k, t in t5.state_dict().items() if (w := transformers_to_wan_t5(k))},
               wan / "models_t5_umt5-xxl-enc-bf16.pth")
    tok.save_pretrained(wan / "google" / "umt5-xxl")
    del t5
    # the training checkpoints
    gen = {f"model.{k}": t for k, t in state.items()}
    ema_key = "model.head.modulation"
    ema = {f"model._fsdp_wrapped_module.{k[6:]}" if k != ema_key else k: t for k, t in gen.items()}
    ema[ema_key] = gen[ema_key] + 1.0  # EMA weights that differ where the check looks
    sf = root / "checkpoints" / "self_forcing_dmd.pt"
    sf.parent.mkdir()
    if "self-forcing" in layouts:
        torch.save({"generator": gen, "generator_ema": ema}, sf)  # shared storages are written once
    ll = root / "longlive_models" / "models" / "longlive_base.pt"
    ll.parent.mkdir(parents=True)
    if layouts & {"longlive", "causvid"}:
        torch.save({"generator": gen}, ll)
    cv = root / "CausVid" / "autoregressive_checkpoint" / "model.pt"
    cv.parent.mkdir(parents=True)
    cv.symlink_to(ll)  # the same layout (generator only); a second 2.8 GB copy would test nothing more
    del gen, ema, state
    g = torch.Generator().manual_seed(4)
    rank = min(LORA_RANK, cfg.dim // 2)
    lora = {}
    for k in sorted(dit_shapes):
        if k.startswith("blocks.") and k.endswith(".weight") and any(
                p in k for p in (".self_attn.q.", ".self_attn.k.", ".self_attn.v.", ".self_attn.o.", ".cross_attn.q.",
                                 ".cross_attn.k.", ".cross_attn.v.", ".cross_attn.o.", ".ffn.0.", ".ffn.2.")):
            out_f, in_f = dit_shapes[k]
            stem = "base_model.model." + k.removesuffix(".weight")
            lora[f"{stem}.lora_A.weight"] = (torch.randn(rank, in_f, generator=g) * 0.01).to(dtype)
            lora[f"{stem}.lora_B.weight"] = (torch.randn(out_f, rank, generator=g) * 0.01).to(dtype)
    torch.save({"generator_lora": lora}, ll.parent / "lora.pt")
    log.info("fullsize: wrote every layout under %s in %.0f s", root, time.perf_counter() - t0)
    out = {"diffusers folder": diff, "wan 2.1 release folder": wan, "self-forcing .pt (generator + generator_ema)": sf,
           "causvid .pt (generator)": cv, "longlive base .pt + lora.pt": ll}
    keep = {"diffusers folder": "diffusers", "wan 2.1 release folder": "wan", "causvid .pt (generator)": "causvid",
            "self-forcing .pt (generator + generator_ema)": "self-forcing", "longlive base .pt + lora.pt": "longlive"}
    return {k: v for k, v in out.items() if keep[k] in layouts or keep[k] in ("diffusers", "wan")}


# -----------------------------------------------------------------------------
# the check


def check_coverage(paths: dict[str, Path], cfg: CausalWanConfig, *, xxl: bool) -> dict[str, int]:
    """Step 2: every layout's key names and shapes against our modules (meta device, headers only)."""
    from transformers import UMT5Config, UMT5EncoderModel

    ours = meta_shapes(lambda: CausalWanDiT(cfg))
    out = {}
    diff, wan = paths["diffusers folder"], paths["wan 2.1 release folder"]
    out["diffusers transformer"] = coverage(safetensors_shapes(diff / "transformer"), diffusers_to_original, ours,
                                            "diffusers transformer/")
    for name in ("self-forcing .pt (generator + generator_ema)", "causvid .pt (generator)"):
        ckpt = read_pt(paths[name])
        for g in ("generator", "generator_ema"):
            if g in ckpt:
                out[f"{name} {g}"] = coverage(
                    {k: tuple(v.shape) for k, v in ckpt[g].items()},
                    lambda k: k.replace("_fsdp_wrapped_module.", "").removeprefix("model."), ours, f"{name} {g}")
    lora = read_pt(paths["longlive base .pt + lora.pt"].parent / "lora.pt")["generator_lora"]
    targets = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] + ".weight" for k in lora}
    if not targets <= set(ours):
        raise AssertionError(f"LoRA targets {sorted(targets - set(ours))[:5]} are not DiT weights")
    out["longlive lora targets"] = len(targets)
    v = meta_shapes(lambda: WanVAEDecoder(cfg.vae))
    decoder_side = {k: s for k, s in safetensors_shapes(diff / "vae").items()
                    if not k.startswith(("encoder.", "quant_conv."))}
    out["diffusers vae"] = coverage(decoder_side, lambda k: k, v, "diffusers vae/")
    out["wan vae"] = coverage({k: tuple(t.shape) for k, t in read_pt(wan / "Wan2.1_VAE.pth").items()},
                              lambda k: wan_vae_to_diffusers(k, cfg.vae), v, "Wan2.1_VAE.pth")
    if xxl:  # the real umT5-XXL layout, Wan's names synthesised from its structure, on the meta device
        xxl_shapes = meta_shapes(lambda: UMT5EncoderModel(UMT5Config(**UMT5_XXL)))
        wan_names = {w: s for k, s in xxl_shapes.items() if (w := transformers_to_wan_t5(k))}
        out["wan umt5-xxl (meta)"] = coverage(wan_names, wan_t5_to_transformers, xxl_shapes,
                                              "models_t5_umt5-xxl-enc-bf16.pth (umT5-XXL, meta)")
    return out


def state_bytes(height: int, width: int) -> dict[str, dict[str, int]]:
    """Declared state per session at `height` x `width` in bf16, by kind, for every preset (meta modules)."""
    from worldcast.models.causal_wan.loading import CausalWanParts
    from worldcast.models.causal_wan.model import CausalWanModel

    out = {}
    for name, preset in PRESETS.items():
        cfg = preset.config()
        with torch.device("meta"):
            dit = CausalWanDiT(cfg).cast(torch.bfloat16)
            vae = WanVAEDecoder(cfg.vae).to(torch.bfloat16)
        m = CausalWanModel(CausalWanParts(cfg=cfg, dit=dit, vae=vae, text=None), name=name,  # type: ignore[arg-type]
                           height=height, width=width)
        kinds: dict[str, int] = {}
        for s in m.spec.states:
            kinds[type(s).__name__] = kinds.get(type(s).__name__, 0) + s.bytes_per_session()
        kinds["total"] = sum(kinds.values())
        out[name] = kinds
    return out


def run_chunk(paths: dict[str, Path], *, height: int, width: int, device: str) -> tuple[float, dict[str, object]]:
    """Step 3: load every DiT layout through the real loader; one chunk of the LongLive model in bf16."""
    from worldcast.models.causal_wan.factory import load

    facts: dict[str, object] = {}
    wan, diff = paths["wan 2.1 release folder"], paths["diffusers folder"]

    def req(weights: Path, **opts: object) -> SimpleNamespace:
        return SimpleNamespace(variant="checkpoint", weights=weights, device=device, options=opts)

    def tensor(path: Path, group: str, name: str) -> torch.Tensor:  # one tensor of a memory-mapped file
        return read_pt(path)[group][name].clone()

    key, w = "head.modulation", "blocks.0.self_attn.q.weight"
    sf_path = paths["self-forcing .pt (generator + generator_ema)"]
    sf = load(req(sf_path, wan_base=wan))
    ema = tensor(sf_path, "generator_ema", f"model.{key}")
    facts["self-forcing serves generator_ema"] = bool(torch.equal(sf.dit.state_dict()[key].float(), ema.float()))
    params = sf.dit.num_params()
    del sf
    gc.collect()
    folder = load(req(diff, wan_preset="self-forcing"))
    facts["diffusers folder loads"] = folder.dit.num_params() == params
    del folder
    gc.collect()
    cv = load(req(paths["causvid .pt (generator)"], wan_base=diff))
    facts["causvid preset chosen"] = cv.spec.name == "causal-wan:causvid"
    del cv
    gc.collect()
    base_w = tensor(paths["longlive base .pt + lora.pt"], "generator", f"model.{w}")
    m = load(req(paths["longlive base .pt + lora.pt"], wan_base=wan, wan_decode_frames=1))
    facts["longlive lora merged"] = not torch.equal(m.dit.state_dict()[w], base_w)
    cfg = m.cfg
    h, w_ = cfg.latent_size(height, width)
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    with torch.no_grad():
        ctx = m.text.encode(["a drone flight over a misty forest"]).to(m.dtype)
        cross = m.dit.cross_kv(ctx)
        attn = DenseSelfAttention(cfg, 1)
        noise = torch.randn(1, cfg.in_channels, cfg.frames_per_chunk, h, w_, generator=g).to(m.dtype)
        x0, _ = generate_chunk(m.dit, noise, cross, attn, torch.tensor([0]), generator=g)
        frames, _ = m.vae.decode_chunk(x0, None, first_chunk=True, frames_per_call=1)
    chunk_ms = (time.perf_counter() - t0) * 1e3
    facts["chunk frames"] = list(frames.shape)
    facts["chunk finite"] = bool(torch.isfinite(frames.float()).all())
    return chunk_ms, {**facts, "params": params}


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(prog="python -m worldcast.models.causal_wan.fullsize", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the same steps at the tiny config (seconds; for tests)")
    p.add_argument("--height", type=int, default=64, help="pixel height of the chunk run (default 64)")
    p.add_argument("--width", type=int, default=64, help="pixel width of the chunk run (default 64)")
    p.add_argument("--tmp", type=Path, default=None, help="where the temporary checkpoints go (default: TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    a = p.parse_args(argv)
    if a.tiny:
        cfg: CausalWanConfig = tiny(vae=WanVAEConfig(base_dim=4, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                                                    latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4))
        dtype = torch.float32
    else:
        cfg, dtype = wan_1_3b(), torch.bfloat16
    root = Path(tempfile.mkdtemp(prefix="worldcast-fullsize-", dir=a.tmp))
    try:
        paths = write_layouts(root, cfg, dtype=dtype, text_layers=1)
        keys = check_coverage(paths, cfg, xxl=not a.tiny)
        chunk_ms, facts = run_chunk(paths, height=a.height, width=a.width, device="cpu")
        failed = [k for k, v in facts.items() if v is False]
        report = {"formats": list(paths), "params": facts.pop("params"), "keys_checked": keys,
                  "state_bytes_per_session": state_bytes(480, 832), "state_resolution": [480, 832],
                  "chunk_ms": round(chunk_ms, 1), "chunk_resolution": [a.height, a.width], "chunk_dtype": str(dtype),
                  "checks": facts, "ok": not failed}
    finally:
        if a.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report))
    if failed:
        raise SystemExit(f"failed checks: {failed}")
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(sys.argv[1:])
