"""Build a model's ahead-of-time step packages (`engine/tuning/packages.py`): the next server start serves from them.

    python -m worldcast.engine.tuning.precompile                    # the default model, as warm-up would serve it
    python -m worldcast.engine.tuning.precompile --dtype bfloat16 --buckets 1 2 4
    make precompile

The dtype is chosen the way warm-up chooses it, but from eager chunks only
(`measure_precisions` with compilation off: about 10 s), unless `--dtype`
names one. For each batch bucket, one chunk of scripted sessions runs eager
while every step records the shapes it is called with
(`StepCompiler.recording`); each (step, bucket) missing from the store is
then exported and compiled with frozen weights: about a minute of CPU per
graph on the 2-vCPU VM, three graphs (denoise, commit, decode) per bucket
for TinyWorld. Packages land in the compile cache
(`<cache>/aot-packages`, the same directory `worldcast serve --compile-cache`
reads), keyed by weights, shapes, torch version and CPU
(`packages.package_key`), so building again is a no-op and new weights
build anew. The server checks each bucket's packages against its graphs
before serving from them (`engine/tuning/warmup.py`, `measure_packages`).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from worldcast.engine.tuning.compiled import DEFAULT_BUCKETS, StepCompiler, configure_cache
from worldcast.engine.tuning.packages import PackageStore
from worldcast.engine.tuning.warmup import ChunkRunner, check_context, measure_precisions, use_way
from worldcast.models import registry
from worldcast.models.base import WorldModel
from worldcast.models.spec import dtype_from_name, dtype_name

logger = logging.getLogger(__name__)


def build_packages(model: WorldModel, store: PackageStore, *, dtype: torch.dtype,
                   buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> list[dict[str, object]]:
    """Build every missing package of `model`'s steps in `dtype` at `buckets`.

    Returns:
        one dict per (step, bucket): {"step", "batch", "key", "built" (False: it was there), "seconds", "error"}.

    Raises:
        ValueError: the model has no compilable steps, or does not declare `dtype`.
    """
    compiler = StepCompiler(model.device, buckets=buckets)
    use_way(model, compiler, dtype, compiled=False)
    if not compiler.steps:
        raise ValueError(f"{model.spec.name} has no step functions to package")
    context = check_context(model)
    with compiler.recording():
        for b in compiler.buckets:
            runner = ChunkRunner(model, batch=b, context=context)
            try:
                runner.chunk()
            finally:
                runner.close()
    rows: list[dict[str, object]] = []
    for b in compiler.buckets:
        for name, step in compiler.steps.items():
            keys = step.package_keys(b, model.device)
            if not keys:
                rows.append({"step": name, "batch": b, "key": None, "built": False, "seconds": 0.0,
                             "error": "never called at this batch"})
            for key, specs in keys:
                row: dict[str, object] = {"step": name, "batch": b, "key": key, "built": False, "seconds": 0.0,
                                          "error": None}
                if not store.has(key):
                    t0 = time.perf_counter()
                    try:
                        store.build(name, step.fn, specs, model.device)
                        row["built"] = True
                    except Exception as e:  # noqa: BLE001 - one graph that does not export leaves the rest to build
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        logger.warning("precompile: %s at batch %d failed: %s", name, b, row["error"])
                    row["seconds"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m worldcast.engine.tuning.precompile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=registry.DEFAULT_MODEL, choices=registry.model_names(), metavar="NAME[:VARIANT]",
                    help=f"model (default {registry.DEFAULT_MODEL}; one of {', '.join(registry.model_names())})")
    ap.add_argument("--weights", type=Path, default=None, help="its weights (default: the variant's own)")
    ap.add_argument("--dtype", default=None, help="build for this dtype (default: chosen as warm-up would, eager)")
    ap.add_argument("--buckets", type=int, nargs="+", default=list(DEFAULT_BUCKETS), help="batch buckets")
    ap.add_argument("--compile-cache", type=Path, default=None, metavar="DIR",
                    help="the compile cache the server reads (default: $TORCHINDUCTOR_CACHE_DIR or "
                         "~/.cache/worldcast/torch-compile)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as served here)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    store = PackageStore.in_cache(configure_cache(args.compile_cache))  # first: torch may set its own default later
    model = registry.load(args.model, weights=args.weights)
    if args.dtype is None:
        choice = measure_precisions(model, StepCompiler(model.device, enabled=False))
        dtype = dtype_from_name(choice.dtype)
        logger.info("precompile: %s", choice.describe())
    else:
        dtype = dtype_from_name(args.dtype)
        if dtype not in model.spec.precisions.dtypes:
            ap.error(f"{model.spec.name} runs in {[dtype_name(d) for d in model.spec.precisions.dtypes]}, "
                     f"not {args.dtype}")
    t0 = time.perf_counter()
    rows = build_packages(model, store, dtype=dtype, buckets=tuple(args.buckets))
    for row in rows:
        print(json.dumps({"dtype": dtype_name(dtype), **row}))
    print(f"packages in {store.root}: {sum(bool(r['built']) for r in rows)} built, "
          f"{sum(not r['built'] and not r['error'] for r in rows)} already there, "
          f"{sum(bool(r['error']) for r in rows)} failed, in {time.perf_counter() - t0:.0f} s")
    if any(r["error"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
