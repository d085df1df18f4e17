"""Train TinyWorld on the procedural world: autoencoder, then the denoiser.

    python -m worldcast.models.tinyworld.train --seed 0

Three phases, one step counter: (1) the frame autoencoder; (2) teacher
forcing: every frame's noisy latent is denoised given clean committed
context, as the KV cache will hold it; (3) rollout training: for half of
each batch the context frames are the model's own rollout (same sampler as
serving) while targets stay the simulator's frames, so the model learns to
correct its own drift (model-notes.md; the idea of Self-Forcing, Huang et al.
2025, with a regression target instead of distribution matching).

Checkpoints (all state, RNGs included) go to --run-dir every --ckpt-every
steps; --resume continues from the latest. Deterministic given --seed and
the step counts (but not across thread counts). The final weights are written
to --out as safetensors.
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.model import DEFAULT_WEIGHTS, TIMESTEPS, save_weights
from worldcast.models.tinyworld.network import (
    DenseAttention,
    FrameAutoencoder,
    TinyWorldConfig,
    TinyWorldDenoiser,
    frame_age_bias,
)
from worldcast.models.tinyworld.prompts import TRAIN_CAPTIONS, PromptEncoder
from worldcast.models.tinyworld.rollout import rollout_latents

logger = logging.getLogger(__name__)

#: Map seeds used for training; evaluation uses seeds from EVAL_SEED_BASE on.
TRAIN_SEEDS = 1000
EVAL_SEED_BASE = 1_000_000


class Data:
    """Simulated training batches: frames, actions, per-frame prompt embeddings."""

    def __init__(self, seed: int, caption_emb: dict[str, np.ndarray], view: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.caption_emb = caption_emb  # theme -> (n, 384)
        self.view = view
        self.maps: dict[int, world.WorldMap] = {}

    def _map(self, s: int) -> world.WorldMap:
        if s not in self.maps:
            self.maps[s] = world.WorldMap.generate(s)
        return self.maps[s]

    def prompt(self, theme: str) -> np.ndarray:
        """A training caption embedding of `theme`, mixed with another and jittered."""
        e = self.caption_emb[theme]
        i, j = self.rng.integers(0, len(e), size=2)
        a = self.rng.random()
        v = a * e[i] + (1 - a) * e[j] + self.rng.normal(0, 0.01, size=e.shape[1])
        return (v / np.linalg.norm(v)).astype(np.float32)

    def frames(self, batch: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns uint8 (B, n, S, S, 3) frames, float32 (B, n, A) actions, float32 (B, n, P) prompts."""
        fr = np.zeros((batch, n, self.view, self.view, 3), np.uint8)
        ac = np.zeros((batch, n, world.ACTION_DIM), np.float32)
        pr = np.zeros((batch, n, 384), np.float32)
        for b in range(batch):
            wm = self._map(int(self.rng.integers(0, TRAIN_SEEDS)))
            themes = [world.THEMES[int(self.rng.integers(0, len(world.THEMES)))]] * n
            if self.rng.random() < 0.3:  # a prompt switch mid-sequence
                k = int(self.rng.integers(1, n))
                other = world.THEMES[int(self.rng.integers(0, len(world.THEMES)))]
                themes = themes[:k] + [other] * (n - k)
            acts = world.random_actions(self.rng, n)
            st = world.WorldState(wm, themes[0], *(int(v) for v in self.rng.integers(0, wm.size, 2)))
            fr[b, 0] = world.render_view(wm, themes[0], st.x, st.y, view=self.view, space=acts[0, 4] > 0.5)
            for i in range(1, n):
                st.theme = themes[i]
                fr[b, i] = world.step(st, acts[i], view=self.view)
            ac[b] = acts
            p0 = self.prompt(themes[0])
            p1 = self.prompt(themes[-1])
            pr[b] = [p0 if th == themes[0] else p1 for th in themes]
        return fr, ac, pr


def to_img(fr: np.ndarray) -> torch.Tensor:
    """uint8 (N, S, S, 3) -> float (N, 3, S, S) in [0, 1]."""
    return torch.from_numpy(fr).permute(0, 3, 1, 2).float() / 255.0


def teacher_forcing_bias(n: int, batch: int, cfg: TinyWorldConfig) -> torch.Tensor:
    """Bias for the sequence [clean 0..n-1, noisy 1..n-1] (see module doc), (B, H, Nq, Nk).

    Clean frames see clean frames by the cache rules; a noisy frame sees the
    clean frames before it by the same rules, and itself; nothing sees a
    noisy frame but itself.
    """
    T = cfg.tokens_per_frame
    idx = torch.cat([torch.arange(n), torch.arange(1, n)]).repeat_interleave(T)  # frame index per token
    noisy = torch.cat([torch.zeros(n * T, dtype=torch.bool), torch.ones((n - 1) * T, dtype=torch.bool)])
    q = idx[None].expand(batch, -1)
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=cfg)
    same = idx[:, None] == idx[None, :]
    ok = torch.where(noisy[None, :], noisy[:, None] & same, ~(noisy[:, None] & same))
    return bias.masked_fill(~ok[None, None], float("-inf"))


def sample_t(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Flow times: half at the sampler's own timesteps, half uniform in (0, 1]."""
    u = torch.rand(shape, generator=g).clamp_min(0.02)
    fixed = torch.tensor(TIMESTEPS)[torch.randint(0, len(TIMESTEPS), shape, generator=g)]
    return torch.where(torch.rand(shape, generator=g) < 0.5, fixed, u)


def lr_at(step: int, total: int, base: float, warmup: int = 50) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ae-steps", type=int, default=1500)
    ap.add_argument("--tf-steps", type=int, default=1500, help="teacher-forcing steps")
    ap.add_argument("--rollout-steps", type=int, default=600, help="steps trained on own rollouts")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--frames", type=int, default=6, help="frames per training sequence")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--width", type=int, default=192)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--run-dir", type=Path, default=Path("runs/tinyworld"))
    ap.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export-only", action="store_true", help="write --out from the latest checkpoint and exit")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    cfg = TinyWorldConfig(width=args.width, layers=args.layers)
    ae, net = FrameAutoencoder(cfg), TinyWorldDenoiser(cfg)
    ema = copy.deepcopy(net).requires_grad_(False)
    logger.info("denoiser %d params, autoencoder %d params", net.num_params(),
                sum(p.numel() for p in ae.parameters()))
    enc = PromptEncoder()
    caption_emb = {t: enc.encode_many(list(c)) for t, c in TRAIN_CAPTIONS.items()}
    theme_prompts = torch.from_numpy(
        np.stack([caption_emb[t].mean(0) / np.linalg.norm(caption_emb[t].mean(0)) for t in world.THEMES])
    )
    data = Data(args.seed, caption_emb, cfg.frame_size)
    g = torch.Generator().manual_seed(args.seed)
    opt_ae = torch.optim.AdamW(ae.parameters(), lr=1e-3, weight_decay=0.0)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    total = args.ae_steps + args.tf_steps + args.rollout_steps
    step = 0
    args.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.run_dir / "ckpt.pt"
    if (args.resume or args.export_only) and ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        ae.load_state_dict(ck["ae"]), net.load_state_dict(ck["net"]), ema.load_state_dict(ck["ema"])
        opt_ae.load_state_dict(ck["opt_ae"]), opt.load_state_dict(ck["opt"])
        data.rng.bit_generator.state = ck["np_rng"]
        g.set_state(ck["torch_rng"])
        step = ck["step"]
        logger.info("resumed at step %d", step)

    if args.export_only:
        save_weights(args.out, cfg, ae, ema, theme_prompts)
        logger.info("exported step %d to %s", step, args.out)
        return

    def save_ckpt() -> None:
        torch.save({"ae": ae.state_dict(), "net": net.state_dict(), "ema": ema.state_dict(),
                    "opt_ae": opt_ae.state_dict(), "opt": opt.state_dict(), "step": step,
                    "np_rng": data.rng.bit_generator.state, "torch_rng": g.get_state()}, ckpt_path)

    n = args.frames
    tf_bias = teacher_forcing_bias(n, args.batch, cfg)
    t0 = time.time()
    bar = tqdm(total=total, initial=step, desc="train", dynamic_ncols=True)
    while step < total:
        if step < args.ae_steps:  # ---- phase 1: autoencoder
            fr, _, _ = data.frames(args.batch, 3)
            x = to_img(fr.reshape(-1, *fr.shape[2:]))
            for pg in opt_ae.param_groups:
                pg["lr"] = lr_at(step, args.ae_steps, 1e-3)
            rec = (ae.dec(ae.enc(x * 2 - 1)) + 1) / 2
            loss = F.mse_loss(rec, x) + 0.5 * F.l1_loss(rec, x)
            opt_ae.zero_grad(set_to_none=True)
            loss.backward()
            opt_ae.step()
            if step == args.ae_steps - 1:  # measure latent statistics for normalisation
                with torch.no_grad():
                    fr, _, _ = data.frames(64, 2)
                    z = ae.enc(to_img(fr.reshape(-1, *fr.shape[2:])) * 2 - 1)
                    ae.latent_mean.copy_(z.mean((0, 2, 3), keepdim=True))
                    ae.latent_std.copy_(z.std((0, 2, 3), keepdim=True))
                ae.requires_grad_(False)
            psnr = -10 * math.log10(F.mse_loss(rec.clamp(0, 1), x).item() + 1e-10)
            bar.set_postfix(phase="ae", loss=f"{loss.item():.4f}", psnr=f"{psnr:.1f}")
        else:  # ---- phases 2 and 3: denoiser
            ae.eval()
            k = step - args.ae_steps
            fr, ac, pr = data.frames(args.batch, n)
            B = args.batch
            with torch.no_grad():
                z = ae.encode(to_img(fr.reshape(-1, *fr.shape[2:]))).reshape(B, n, *ae_shape(cfg))
            act, pro = torch.from_numpy(ac), torch.from_numpy(pr)
            ctx = z.clone()
            own = k >= args.tf_steps
            if own:  # context of half the batch from the model's own rollout
                h = B // 2
                net.eval()
                ctx[:h, 1:] = rollout_latents(net, z[:h, 0], act[:h], pro[:h], timesteps=TIMESTEPS, generator=g)
                net.train()
            t = sample_t((B, n - 1), g)
            eps = torch.randn(z[:, 1:].shape, generator=g)
            tb = t[:, :, None, None, None]
            x_t = (1 - tb) * z[:, 1:] + tb * eps
            prev = torch.cat([ctx[:, :1], ctx[:, :-1]], 1)  # previous frame per clean frame
            seq_x = torch.cat([ctx, x_t], 1)
            seq_prev = torch.cat([prev, ctx[:, :-1]], 1)
            seq_t = torch.cat([torch.zeros(B, n), t], 1)
            seq_a = torch.cat([act, act[:, 1:]], 1)
            seq_p = torch.cat([pro, pro[:, 1:]], 1)
            for pg in opt.param_groups:
                pg["lr"] = lr_at(k, args.tf_steps + args.rollout_steps, args.lr)
            x0, _ = net(seq_x, seq_prev, seq_t, seq_a, seq_p, DenseAttention(None, tf_bias))
            loss = F.mse_loss(x0[:, n:], z[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                decay = min(0.995, (1 + k) / (10 + k))
                for pe, p in zip(ema.parameters(), net.parameters(), strict=True):
                    pe.lerp_(p, 1 - decay)
            bar.set_postfix(phase="rollout" if own else "tf", loss=f"{loss.item():.4f}")
        step += 1
        bar.update(1)
        if step % args.ckpt_every == 0 or step == total:
            save_ckpt()
    bar.close()
    save_weights(args.out, cfg, ae, ema, theme_prompts)
    logger.info("wrote %s after %d steps (%.0f s this run)", args.out, step, time.time() - t0)


def ae_shape(cfg: TinyWorldConfig) -> tuple[int, int, int]:
    return (cfg.latent_channels, cfg.latent_size, cfg.latent_size)


if __name__ == "__main__":
    main()
