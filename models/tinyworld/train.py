"""Train TinyWorld on the procedural world: teacher forcing in pixel space.

    python -m worldcast.models.tinyworld.train --seed 0

Every step draws sequences of simulator frames (random maps, themes, a
scripted player, prompt switches) and trains the denoiser to predict each
frame's clean pixels from its noisy version at a random flow time, given the
clean frames before it as the KV cache will hold them (one teacher-forced
sequence [clean 0..n-1, noisy 1..n-1] per forward, `teacher_forcing_bias`).
Serving makes each frame in one pass from pure noise (flow time 1, then the
commit), so training draws t = 1 (`TRAIN_TIMES`). The loss has four terms,
each its own mean: per-pixel MSE over what the network imagines (the revealed
strip and the marker), MSE over cut frames' repaints (a prompt switch
recolours the world: the frame is not the previous one moved), the object
probability's binary cross-entropy against the simulator's object coverage
over those same pixels (so serving can draw objects from it,
`network.draw_objects`), and the cut classifier's binary cross-entropy
against the simulator's own cuts; the painter is shown the true cuts while it
learns.

Checkpoints (all state, RNGs included) go to --run-dir every --ckpt-every
steps (written whole, then renamed); --resume continues from the latest. A
non-finite loss stops the run with the step and the batch's RNG state in its
message; the last checkpoint stays. Deterministic given --seed and --steps
(but not across thread counts). The EMA weights are written to --out as
safetensors.
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
from worldcast.models.tinyworld.model import DEFAULT_WEIGHTS, save_weights
from worldcast.models.tinyworld.network import (
    DenseAttention,
    TinyWorldConfig,
    TinyWorldDenoiser,
    camera_shift,
    frame_age_bias,
    to_frame_space,
    warp,
)
from worldcast.models.tinyworld.prompts import TRAIN_CAPTIONS, PromptEncoder

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

    def frames(self, batch: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Returns uint8 (B, n, S, S, 3) frames, float32 (B, n, A) actions, float32 (B, n, P) prompts and
        float32 (B, n, S, S) object coverage in [0, 1] (`world.object_view`)."""
        fr = np.zeros((batch, n, self.view, self.view, 3), np.uint8)
        ob = np.zeros((batch, n, self.view, self.view), np.float32)
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
            ob[b, 0] = world.object_view(wm, st.x, st.y, view=self.view)
            for i in range(1, n):
                st.theme = themes[i]
                fr[b, i] = world.step(st, acts[i], view=self.view)
                ob[b, i] = world.object_view(wm, st.x, st.y, view=self.view)
            ac[b] = acts
            p0 = self.prompt(themes[0])
            p1 = self.prompt(themes[-1])
            pr[b] = [p0 if th == themes[0] else p1 for th in themes]
        return fr, ac, pr, ob


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


#: The flow times training draws from: serving's one pass from pure noise (`model.TIMESTEPS`).
TRAIN_TIMES = (1.0,)


def sample_t(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Flow times drawn uniformly from `TRAIN_TIMES`."""
    return torch.tensor(TRAIN_TIMES)[torch.randint(0, len(TRAIN_TIMES), shape, generator=g)]


def lr_at(step: int, total: int, base: float, warmup: int = 50) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=2500, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--frames", type=int, default=6, help="frames per training sequence")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cut-weight", type=float, default=0.02, help="weight of the cut classifier's loss")
    ap.add_argument("--cut-repaint-weight", type=float, default=0.3, help="weight of the cut frames' repaint loss")
    ap.add_argument("--object-weight", type=float, default=0.1,
                    help="weight of the object probability's cross-entropy")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--width", type=int, default=TinyWorldConfig.width)
    ap.add_argument("--layers", type=int, default=TinyWorldConfig.layers)
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
    net = TinyWorldDenoiser(cfg)
    ema = copy.deepcopy(net).requires_grad_(False)
    logger.info("denoiser %d params", net.num_params())
    enc = PromptEncoder()
    caption_emb = {t: enc.encode_many(list(c)) for t, c in TRAIN_CAPTIONS.items()}
    theme_prompts = torch.from_numpy(
        np.stack([caption_emb[t].mean(0) / np.linalg.norm(caption_emb[t].mean(0)) for t in world.THEMES])
    )
    data = Data(args.seed, caption_emb, cfg.frame_size)
    g = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    step = 0
    args.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.run_dir / "ckpt.pt"
    if (args.resume or args.export_only) and ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        net.load_state_dict(ck["net"]), ema.load_state_dict(ck["ema"]), opt.load_state_dict(ck["opt"])
        data.rng.bit_generator.state = ck["np_rng"]
        g.set_state(ck["torch_rng"])
        step = ck["step"]
        logger.info("resumed at step %d", step)

    if args.export_only:
        save_weights(args.out, cfg, ema, theme_prompts)
        logger.info("exported step %d to %s", step, args.out)
        return

    def save_ckpt() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"net": net.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "step": step,
                    "np_rng": data.rng.bit_generator.state, "torch_rng": g.get_state()}, tmp)
        tmp.replace(ckpt_path)

    n, B = args.frames, args.batch
    tf_bias = teacher_forcing_bias(n, B, cfg)
    t0 = time.time()
    bar = tqdm(total=args.steps, initial=step, desc="train", dynamic_ncols=True)
    while step < args.steps:
        rng_state = data.rng.bit_generator.state
        fr, ac, pr, ob = data.frames(B, n)
        z = to_frame_space(to_img(fr.reshape(-1, *fr.shape[2:]))).reshape(B, n, cfg.channels, *fr.shape[2:4])
        act, pro = torch.from_numpy(ac), torch.from_numpy(pr)
        t = sample_t((B, n - 1), g)
        eps = torch.randn(z[:, 1:].shape, generator=g)
        tb = t[:, :, None, None, None]
        x_t = (1 - tb) * z[:, 1:] + tb * eps
        prev = torch.cat([z[:, :1], z[:, :-1]], 1)  # previous frame per clean frame
        seq_x = torch.cat([z, x_t], 1)
        seq_prev = torch.cat([prev, z[:, :-1]], 1)
        seq_t = torch.cat([torch.zeros(B, n), t], 1)
        seq_a = torch.cat([act, act[:, 1:]], 1)
        seq_p = torch.cat([pro, pro[:, 1:]], 1)
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, args.steps, args.lr)
        # a cut: the simulator's frame is not the previous one moved (a prompt switch recoloured the world)
        dx, dy = camera_shift(act[:, 1:].flatten(0, 1))
        warped, known = warp(z[:, :-1].flatten(0, 1), dx, dy, net.marker)
        moved_err = (known * (warped - z[:, 1:].flatten(0, 1)) ** 2).sum((1, 2, 3)) / known.sum((1, 2, 3)).clamp_min(1)
        cut = (moved_err > 1e-4).view(B, n - 1)
        x0, _, cut_logit, obj_logit = net.predict(seq_x, seq_prev, seq_t, seq_a, seq_p, DenseAttention(None, tf_bias),
                                       predict_from=n, cut=cut)
        # each job its own mean: the revealed strip and the marker (a few % of a frame's pixels, where the world is
        # imagined) would otherwise drown under cut frames' full repaints
        err = (x0.flatten(0, 1) - z[:, 1:].flatten(0, 1)).pow(2).mean(1, keepdim=True)  # (N, 1, S, S)
        is_cut = cut.flatten().float()[:, None, None, None]
        painted = (1 - known) * (1 - is_cut)
        loss_new = (err * painted).sum() / painted.sum().clamp_min(1)
        loss_cut = (err * is_cut).sum() / (is_cut.sum() * err[0].numel()).clamp_min(1)
        loss_cls = F.binary_cross_entropy_with_logits(cut_logit, cut.float())
        # the object probability where the network paints (strip, cut frames), not on the marker (an overlay)
        where = torch.maximum(painted, is_cut.expand_as(painted)) * (~net.marker).float()
        coverage = torch.from_numpy(ob[:, 1:]).flatten(0, 1)[:, None]  # (N, 1, S, S)
        bce = F.binary_cross_entropy_with_logits(obj_logit.flatten(0, 1), coverage, reduction="none")
        loss_obj = (bce * where).sum() / where.sum().clamp_min(1)
        loss = (loss_new + args.cut_repaint_weight * loss_cut + args.cut_weight * loss_cls
                + args.object_weight * loss_obj)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite loss {loss.item()} at step {step}; the batch came from data RNG state "
                f"{rng_state['state']} (seed {args.seed}); the last good checkpoint is {ckpt_path}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            decay = min(0.995, (1 + step) / (10 + step))
            for pe, p in zip(ema.parameters(), net.parameters(), strict=True):
                pe.lerp_(p, 1 - decay)
        step += 1
        bar.update(1)
        bar.set_postfix(new=f"{loss_new.item():.4f}", cut=f"{loss_cut.item():.3f}", cls=f"{loss_cls.item():.3f}",
                        obj=f"{loss_obj.item():.3f}")
        if step % args.ckpt_every == 0 or step == args.steps:
            save_ckpt()
    bar.close()
    save_weights(args.out, cfg, ema, theme_prompts)
    logger.info("wrote %s after %d steps (%.0f s this run)", args.out, step, time.time() - t0)


if __name__ == "__main__":
    main()
