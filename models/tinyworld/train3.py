"""Train TinyWorld 3 on the procedural world: a learned motion head and a flow painter trained at every noise level.

    python -m worldcast.models.tinyworld.train3 --seed 0 --steps 4000     # `make train3`

Every step draws sequences of simulator frames (random maps, themes, a scripted player, prompt switches;
`train.Data`). From the frames alone it measures each frame's camera move (`measure_shifts`: phase correlation,
checked by warping; the exhaustive search over every shift where that check fails) and whether the frame is a
cut (no shift explains it: a prompt switch recoloured the world). Then, teacher-forced over the sequence:

- the motion head learns the measured move from the action (cross-entropy, non-cut frames);
- the transformer reads each frame's input (the previous frame warped by the measured move, its known mask,
  action, prompt) with the cache's window/sink attention pattern, and its cut classifier learns the cuts;
- the painter predicts the frame's clean pixels from x_t = (1 - t) x0 + t eps at a flow time t drawn uniformly
  from (0, 1] per frame (`network3.train_times`): MSE over the pixels it paints (the revealed strip and the marker;
  every pixel of a cut frame, weighted `--cut-repaint-weight`), each its own mean.

Nothing about the simulator's rules reaches the network but its frames. Checkpoints (all state, RNGs included)
go to --run-dir every --ckpt-every steps; --resume continues; a non-finite loss stops the run naming the step and
the batch's RNG state, the last checkpoint kept. The EMA weights and the starting images (`--start-dir`: one
simulator view per world, the picture a session starts from, shipped beside the weights and named as such) are
written at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from worldcast.models.tinyworld import picture, world
from worldcast.models.tinyworld.backbone import DenseAttention, frame_age_bias, marker_mask, to_frame_space, warp
from worldcast.models.tinyworld.network3 import TinyWorld3, TinyWorld3Config, train_times
from worldcast.models.tinyworld.prompts import TRAIN_CAPTIONS, PromptEncoder
from worldcast.models.tinyworld.train import Data, lr_at, to_img

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEFAULT_OUT = WEIGHTS_DIR / "tinyworld3.safetensors"
DEFAULT_START_DIR = WEIGHTS_DIR / "start"
#: Map seeds the starting images are rendered from (held out from training, evaluation and the play test).
START_SEED_BASE = 5_000_000
#: A frame is explained by a shift when the warped previous frame matches it this well (mean squared error over
#: the known pixels, frame space): the simulator's frames match exactly (0) at their move.
MATCH_MSE = 1e-4


def measure_shifts(prev: np.ndarray, cur: np.ndarray, max_shift: int) -> tuple[np.ndarray, np.ndarray]:
    """The camera's move between frames, read from the frames: (dx, dy) int64 (N, 2), and cut bool (N,).

    Phase correlation proposes a shift (`picture.camera_shift`); warping the previous frame by it must match the
    frame (`MATCH_MSE`), else every shift within +-max_shift is tried; a frame no shift matches is a cut.

    Args:
        prev, cur: uint8 (N, S, S, 3) consecutive frames.
    """
    N, S = prev.shape[:2]
    marker = marker_mask(S)
    a = to_frame_space(to_img(prev))
    b = to_frame_space(to_img(cur))

    def err(dx: torch.Tensor, dy: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        w, k = warp(a[rows], dx, dy, marker)
        return (k * (w - b[rows]) ** 2).sum((1, 2, 3)) / (3 * k.sum((1, 2, 3))).clamp_min(1)

    prop = np.array([picture.camera_shift(prev[i], cur[i])[0] for i in range(N)], np.int64)
    prop = np.clip(prop, -max_shift, max_shift)
    shifts = torch.from_numpy(prop)
    e = err(shifts[:, 0], shifts[:, 1], torch.arange(N))
    bad = torch.nonzero(e > MATCH_MSE).flatten()
    if len(bad):
        grid = torch.arange(-max_shift, max_shift + 1)
        cand = torch.cartesian_prod(grid, grid)  # (K, 2) dx, dy
        for i in bad.tolist():
            rows = torch.full((len(cand),), i)
            ce = err(cand[:, 0], cand[:, 1], rows)
            j = int(ce.argmin())
            shifts[i], e[i] = cand[j], ce[j]
    return shifts.numpy(), (e > MATCH_MSE).numpy()


def save_weights3(path: Path, cfg: TinyWorld3Config, net: TinyWorld3, theme_prompts: torch.Tensor) -> None:
    """Write the network and theme prompt centroids to one safetensors file (the config in its metadata)."""
    tensors = {f"net.{k}": v.detach().contiguous() for k, v in net.state_dict().items()}
    tensors["theme_prompts"] = theme_prompts.contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"config": json.dumps(cfg.__dict__)})


def save_start_images(folder: Path, size: int) -> list[Path]:
    """One starting image per world (`world.THEMES`): the simulator's view at the origin of a held-out map, as PNG
    (`START_SEED_BASE` + the world's index). The served model starts every session from its prompt's world's."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, theme in enumerate(world.THEMES):
        img = world.render_view(world.WorldMap.generate(START_SEED_BASE + i), theme, 0, 0, view=size)
        p = folder / f"{theme}.png"
        Image.fromarray(img).save(p)
        out.append(p)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4000, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--frames", type=int, default=6, help="frames per training sequence")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cut-weight", type=float, default=0.05, help="weight of the cut classifier's loss")
    ap.add_argument("--cut-repaint-weight", type=float, default=0.3, help="weight of the cut frames' repaint loss")
    ap.add_argument("--motion-weight", type=float, default=1.0, help="weight of the motion head's loss")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run-dir", type=Path, default=Path("runs/tinyworld3"))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--start-dir", type=Path, default=DEFAULT_START_DIR)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export-only", action="store_true", help="write --out from the latest checkpoint and exit")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="stop (checkpoint and export) after this many minutes of this run")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    cfg = TinyWorld3Config()
    net = TinyWorld3(cfg)
    ema = copy.deepcopy(net).requires_grad_(False)
    logger.info("TinyWorld 3: %d params (painter %d)", net.num_params(),
                sum(p.numel() for p in net.painter.parameters()))
    enc = PromptEncoder()
    caption_emb = {t: enc.encode_many(list(c)) for t, c in TRAIN_CAPTIONS.items()}
    theme_prompts = torch.from_numpy(
        np.stack([caption_emb[t].mean(0) / np.linalg.norm(caption_emb[t].mean(0)) for t in world.THEMES]))
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

    def export() -> None:
        save_weights3(args.out, cfg, ema, theme_prompts)
        save_start_images(args.start_dir, cfg.frame_size)
        logger.info("wrote %s and the starting images in %s (step %d)", args.out, args.start_dir, step)

    if args.export_only:
        export()
        return

    def save_ckpt() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"net": net.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "step": step,
                    "np_rng": data.rng.bit_generator.state, "torch_rng": g.get_state()}, tmp)
        tmp.replace(ckpt_path)

    n, B, S = args.frames, args.batch, cfg.frame_size
    idx = torch.arange(n - 1)
    q = idx.repeat_interleave(cfg.tokens_per_frame)[None].expand(B, -1)
    bias = frame_age_bias(q, q, torch.ones_like(q, dtype=torch.bool), cfg=cfg)  # (B, H, N, N) frame-causal
    t0 = time.time()
    while step < args.steps:
        rng_state = data.rng.bit_generator.state
        fr, ac, pr, _ = data.frames(B, n)
        prev_u8, cur_u8 = fr[:, :-1].reshape(-1, S, S, 3), fr[:, 1:].reshape(-1, S, S, 3)
        shifts, cuts = measure_shifts(prev_u8, cur_u8, cfg.max_shift)
        z = to_frame_space(to_img(fr.reshape(-1, S, S, 3))).reshape(B, n, 3, S, S)
        act, pro = torch.from_numpy(ac[:, 1:]), torch.from_numpy(pr[:, 1:])
        sh = torch.from_numpy(shifts)
        cut = torch.from_numpy(cuts)
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, args.steps, args.lr)
        ctx = net.context(z[:, :-1], act, pro, DenseAttention(None, bias), shift=(sh[:, 0], sh[:, 1]), cut=cut)
        x0 = z[:, 1:].flatten(0, 1)  # (N, 3, S, S)
        t = train_times(x0.shape[0], g)
        eps = torch.randn(x0.shape, generator=g)
        tb = t[:, None, None, None]
        _, painted = net.paint((1 - tb) * x0 + tb * eps, t, ctx.warped, ctx.known, ctx.features, ctx.cond, ctx.cut)
        err = (painted - x0).pow(2).mean(1, keepdim=True)  # (N, 1, S, S)
        is_cut = cut.float()[:, None, None, None]
        new = (1 - ctx.known) * (1 - is_cut)  # the revealed strip and the marker (`warp` leaves it unknown)
        loss_new = (err * new).sum() / new.sum().clamp_min(1)
        loss_cut = (err * is_cut).sum() / (is_cut.sum() * err[0].numel()).clamp_min(1)
        loss_cls = F.binary_cross_entropy_with_logits(ctx.cut_logit, cut.float())
        logits = net.motion(act.flatten(0, 1))  # (N, 2, classes)
        target = sh + cfg.max_shift  # (N, 2) class indices
        moved = ~cut
        loss_motion = (F.cross_entropy(logits[moved].flatten(0, 1), target[moved].flatten())
                       if moved.any() else logits.sum() * 0)
        loss = (loss_new + args.cut_repaint_weight * loss_cut + args.cut_weight * loss_cls
                + args.motion_weight * loss_motion)
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
        if step % 20 == 0:
            acc = float((logits.argmax(-1) == target).all(-1)[moved].float().mean()) if moved.any() else math.nan
            logger.info("step %d  new %.4f  cut %.4f  cls %.3f  motion %.3f (exact %.2f)  %.2f s/step", step,
                        loss_new.item(), loss_cut.item(), loss_cls.item(), loss_motion.item(), acc,
                        (time.time() - t0) / max(1, step))
        if step % args.ckpt_every == 0 or step == args.steps:
            save_ckpt()
        if args.max_minutes is not None and time.time() - t0 > 60 * args.max_minutes:
            logger.info("time limit reached at step %d", step)
            save_ckpt()
            break
    export()
    logger.info("trained %d steps in %.0f s", step, time.time() - t0)


if __name__ == "__main__":
    main()
