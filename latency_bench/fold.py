"""The commit fold, checked and timed beside what serves (issue 19: "the commit pass folded into the
next chunk's first step where the family allows it (measure both)").

    python -m worldcast.latency_bench.fold --batches 1 2 4 --repeats 20
    python -m worldcast.latency_bench.fold --batches 1 2 --compiled       # both ways through torch.compile

For each batch size, `batch` scripted sessions of the shipped TinyWorld run
a few chunks (the ring fills), then chunk j's denoising steps. From that
state the two ways are run on the same inputs: unfolded (what serves: the
commit pass over frame j, then chunk j + 1's first denoising step over the
committed ring) and folded (`models/tinyworld/fold.py`: one forward over
both frames from the ring before the commit). The check is the largest
absolute difference between the ways' x0 and between the K/V they write;
the times are medians over interleaved rounds on `timing.work_clock`, the
masks and rings built once, as serving builds them once per chunk. The
chunk times printed are sums of timed parts: unfolded, `denoising_steps`
denoise passes, a decode and the commit pass; folded, the folded forward in
place of the commit and the first denoise pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from worldcast.engine.rollout import denoise_batch, finalize_batch
from worldcast.engine.state_pool import PoolView
from worldcast.engine.timing import work_clock
from worldcast.engine.tuning.warmup import ChunkRunner, check_context
from worldcast.models.base import ChunkConditioning
from worldcast.models.spec import dtype_name
from worldcast.models.tinyworld.fold import fold_mask, fold_step
from worldcast.models.tinyworld.model import TinyWorldModel
from worldcast.models.tinyworld.network import alibi_slopes

#: Largest difference between the ways that still counts as the same math in float32 (measured: 1e-7 for x0,
#: 4e-6 for K/V; a wrong mask gives more than 1e-3: tests/latency_bench/test_fold.py).
CHECK_TOLERANCE = 1e-4


@dataclass
class FoldCase:
    """Both ways' inputs at one chunk boundary, for `batch` sessions (tensors on the model's device).

    Attributes:
        runner: the scripted sessions and their pool; view: their slots, as one batch.
        x0_prev: (B, 1, C, h, w) chunk j's clean latent; prev_prev: (B, 1, C, h, w) chunk j - 1's.
        cond_prev, cond_new: chunk j's and chunk j + 1's batch conditioning.
        k_ring, v_ring: (B, layers, L, H, hd) the ring before chunk j's commit; mask: its `fold_mask`.
        x_t: (B, 1, C, h, w) chunk j + 1's noise; t: (B,) its first flow time.
        ref_x0, ref_k, ref_v: the unfolded way's x0 of chunk j + 1 and chunk j's committed K/V.
        draw_noise: (B, 1, 1, h, w) chunk j + 1's draw noise (`TinyWorldModel.draw_noise`).
        fold_fn: `fold_step`, eager or compiled.
    """

    runner: ChunkRunner
    view: PoolView
    x0_prev: torch.Tensor
    prev_prev: torch.Tensor
    cond_prev: ChunkConditioning
    cond_new: ChunkConditioning
    k_ring: torch.Tensor
    v_ring: torch.Tensor
    mask: torch.Tensor
    x_t: torch.Tensor
    t: torch.Tensor
    ref_x0: torch.Tensor
    ref_k: torch.Tensor
    ref_v: torch.Tensor
    draw_noise: torch.Tensor
    fold_fn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = fold_step  #: eager or compiled

    def unfolded(self) -> None:
        """The commit pass over chunk j, then chunk j + 1's first denoising pass (nothing applied)."""
        m = self.runner.model
        m.commit(self.x0_prev, self.cond_prev, self.view)
        m.denoise(self.x_t, self.t, self.cond_new, self.view)

    def folded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The one folded forward: x0 of chunk j + 1 and chunk j's K/V."""
        m = self.runner.model
        assert isinstance(m, TinyWorldModel)
        prompt_prev = self.cond_prev.context["prompt"][:, None]
        prompt_new = self.cond_new.context["prompt"][:, None]
        return self.fold_fn(m.net, self.x0_prev, self.prev_prev, self.x_t, self.t[:, None], self.cond_prev.action,
                            self.cond_new.action, prompt_prev, prompt_new, self.k_ring, self.v_ring, self.mask,
                            self.draw_noise)


def make_case(model: TinyWorldModel, *, batch: int, warm_chunks: int = 6,
              fold_fn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = fold_step) -> FoldCase:
    """Run `warm_chunks` chunks of `batch` scripted sessions, then chunk j's steps; compute the unfolded
    reference (commit K/V, then chunk j + 1's first x0) and the folded way's inputs."""
    runner = ChunkRunner(model, batch=batch, context=check_context(model))
    for _ in range(warm_chunks):
        runner.chunk()
    rs, cache, spec = runner.rollouts, runner.cache, model.spec
    for r in rs:
        r.begin_chunk(0.0, 0.0)
    for k in range(spec.denoising_steps):
        denoise_batch(rs, [k] * batch, cache)
    b_prev = cache.get(rs)
    x0_prev = torch.stack([r.staged.x_t for r in rs])  # type: ignore[union-attr]
    view = b_prev.view
    k_pool, v_pool, ring_frame = view.ring("kv")
    slots = list(view.slots_host)
    k_ring, v_ring, kf = k_pool[slots].clone(), v_pool[slots].clone(), ring_frame[slots].clone()
    prev_prev = view.tensor("prev")[:, None].clone()
    cond_prev = b_prev.cond
    kv = model.commit(x0_prev, cond_prev, view)["kv"]
    ref_k, ref_v = torch.stack(kv.k, dim=1), torch.stack(kv.v, dim=1)  # (B, layers, T, H, hd)
    finalize_batch(rs, 0.0, cache=cache)  # decode, commit applied: chunk j done
    for r in rs:
        r.begin_chunk(0.0, 0.0)
    b_new = cache.get(rs)
    x_t = torch.stack([r.staged.x_t for r in rs])  # type: ignore[union-attr]
    t = cache.timesteps(model)[0].expand(batch)
    # the fold is a question about the network's two passes; the world memory's recall (ground the marker hid a
    # frame before, `models/tinyworld/memory.py`) is outside it, so the reference recalls none either
    recall, model.recall_memory = model.recall_memory, False
    try:
        ref_x0 = model.denoise(x_t, t, b_new.cond, b_new.view)
    finally:
        model.recall_memory = recall
    mask = fold_mask(kf, b_new.cond.frame_index[:, :1], alibi_slopes(model.cfg.heads).to(kf.device), model.cfg,
                     model.precision)
    draw_noise = model.draw_noise(b_new.cond, b_new.view)  # the chunk's, as its denoising pass drew with
    return FoldCase(runner, b_new.view, x0_prev, prev_prev, cond_prev, b_new.cond, k_ring, v_ring, mask, x_t, t,
                    ref_x0, ref_k, ref_v, draw_noise, fold_fn)


@dataclass
class FoldResult:
    """One batch size: the check and the times, ms."""

    batch: int
    max_abs_x0: float
    max_abs_kv: float
    unfolded_ms: float  #: commit pass + first denoising pass
    folded_ms: float  #: the folded forward
    denoise_ms: float  #: one denoising pass (the chunk's other steps)
    decode_ms: float
    chunk_unfolded_ms: float
    chunk_folded_ms: float


def check(case: FoldCase) -> tuple[float, float]:
    """Largest |x0 folded - x0 unfolded| and |K/V folded - K/V committed|."""
    x0, k, v = case.folded()
    kv = max((k.float() - case.ref_k.float()).abs().max().item(), (v.float() - case.ref_v.float()).abs().max().item())
    return (x0 - case.ref_x0).abs().max().item(), kv


def measure(case: FoldCase, *, repeats: int) -> FoldResult:
    """Interleaved rounds of the unfolded passes, the folded forward, one denoise pass and one decode."""
    m = case.runner.model
    clock = work_clock(m.device)
    ways = {"unfolded": case.unfolded, "folded": case.folded,
            "denoise": lambda: m.denoise(case.x_t, case.t, case.cond_new, case.view),
            "decode": lambda: m.decode(case.x0_prev, case.cond_prev, case.view)}
    samples: dict[str, list[float]] = {k: [] for k in ways}
    for fn in ways.values():  # untimed: first calls pay one-time costs
        fn()
    for _ in range(repeats):
        for name, fn in ways.items():
            t0 = clock()
            fn()
            if m.device.type == "cuda":
                torch.cuda.synchronize(m.device)
            samples[name].append((clock() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in samples.items()}
    dx, dkv = check(case)
    rest = (m.spec.denoising_steps - 1) * med["denoise"] + med["decode"]
    return FoldResult(len(case.runner.rollouts), dx, dkv, med["unfolded"], med["folded"], med["denoise"],
                      med["decode"], rest + med["unfolded"], rest + med["folded"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.latency_bench.fold", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4],
                    help="batch sizes (sessions per forward), each 1..16 (default: 1 2 4)")
    ap.add_argument("--repeats", type=int, default=20, help="timed interleaved rounds, 1..1000 (default: 20)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--compiled", action="store_true",
                    help="run the model's steps and the folded forward through torch.compile (builds first)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if not all(1 <= b <= 16 for b in args.batches) or not 1 <= args.repeats <= 1000 or args.threads < 1:
        ap.error("need batches in 1..16, 1 <= --repeats <= 1000, --threads >= 1")
    torch.set_num_threads(args.threads)
    model = TinyWorldModel.from_pretrained()
    fold_fn = fold_step
    if args.compiled:
        # every wrapped step shares one code object (the wrapper's), one graph per step and batch
        torch._dynamo.config.recompile_limit = 64
        torch._dynamo.config.accumulated_recompile_limit = 512
        model.compile_steps(lambda name, fn: torch.compile(fn, dynamic=False))
        fold_fn = torch.compile(fold_step, dynamic=False)
    results = []
    with torch.no_grad():
        for b in args.batches:
            case = make_case(model, batch=b, fold_fn=fold_fn)
            try:
                r = measure(case, repeats=args.repeats)
            finally:
                case.runner.close()
            results.append(r)
            saved = 1 - r.chunk_folded_ms / r.chunk_unfolded_ms
            ok = "within" if max(r.max_abs_x0, r.max_abs_kv) <= CHECK_TOLERANCE else "OVER"
            print(f"batch {b} ({dtype_name(model.precision)}): check max |dx0| {r.max_abs_x0:.2e}, max |dK/V| "
                  f"{r.max_abs_kv:.2e} ({ok} {CHECK_TOLERANCE:g}); commit + first step {r.unfolded_ms:.1f} ms, "
                  f"folded step {r.folded_ms:.1f} ms; chunk (the other steps and decode added) "
                  f"{r.chunk_unfolded_ms:.1f} -> {r.chunk_folded_ms:.1f} ms "
                  f"({abs(saved) * 100:.1f} % {'saved' if saved >= 0 else 'lost'})", flush=True)
    if args.json:
        out: dict[str, Any] = {"threads": args.threads, "compiled": args.compiled,
                               "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
