"""A first evaluation of TinyWorld 3 (`tinyworld:3`): the play test's measures and the shapes, each world against
the simulator, as trained and with what the painter paints ablated (the motion kept).

    python -m worldcast.models.tinyworld.evaluate3 --seconds 30 --no-compile     # writes weights/eval/tinyworld3.*

Every world is played through the served path (`playtest.served_rollout`) by the play test's scripted player on
held-out map seeds (`playtest.MAP_SEED_BASE` on); over the second half of the session: texture and objects
(`picture.py`, as the play test), whole objects per frame, their median area and roundness, and the terrain's
structure function (`shapes.py`), each as model / simulator, and the held-input seconds whose camera shift
measured from the pictures matches the simulator's (`playtest.window_stats`). Then the same with each of the
model's `ABLATIONS`: a measure the ablated model matches as well as the model cannot credit the painter.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from worldcast.models.tinyworld import playtest, shapes, world
from worldcast.models.tinyworld.model3 import DEFAULT_WEIGHTS3, TinyWorld3Model
from worldcast.models.tinyworld.prompts import TRAIN_CAPTIONS

logger = logging.getLogger(__name__)


def play(model: TinyWorld3Model, *, seconds: int, seed: int) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Every world for `seconds` s (module doc): per world the measures, and the simulator/model videos."""
    rng = np.random.default_rng(seed)
    n = seconds * playtest.FPS
    out: dict[str, object] = {}
    videos = {}
    for w, theme in enumerate(world.THEMES):
        acts, segs = playtest.player_script(rng, n)
        map_seed = playtest.MAP_SEED_BASE + w
        fr = playtest.served_rollout(model, map_seed, model.encode_prompt(TRAIN_CAPTIONS[theme][0]), acts)
        sim = playtest.simulate_script(map_seed, theme, acts)
        lo = n // 2
        st = playtest.window_stats(fr, sim, theme, segs, lo, n + 1)
        secs = st["held_input_seconds"]
        out[theme] = {
            "texture": st["texture"] / max(st["sim_texture"], 1e-9),  # type: ignore[operator]
            "objects_share": st["objects"] / max(st["sim_objects"], 1e-9),  # type: ignore[operator]
            "objects": shapes.ratios(shapes.objects(fr[lo:], theme), shapes.objects(sim[lo:], theme)),
            "structure": shapes.ratios(shapes.structure_function(fr[lo:], theme),
                                       shapes.structure_function(sim[lo:], theme)),
            "keys_answered": [sum(s["answered"] for s in secs), len(secs)],  # type: ignore[union-attr]
        }
        videos[theme] = np.stack([sim, fr])
    return out, videos


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS3)
    ap.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS3.parent / "eval")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    model = TinyWorld3Model.from_pretrained(args.weights)
    way = playtest.choose_way(model, compile_steps=not args.no_compile)
    t0 = time.time()
    report: dict[str, object] = {"command": "python -m worldcast.models.tinyworld.evaluate3 " + " ".join(
        argv if argv is not None else __import__("sys").argv[1:]), "served_way": way, "seconds": args.seconds}
    measured, videos = play(model, seconds=args.seconds, seed=args.seed)
    report["model"] = measured
    ks = [0, 1, args.seconds // 4, args.seconds // 2, args.seconds]
    playtest.save_worlds(args.out / "tinyworld3.png", videos, [float(k) for k in ks])
    for name in model.ABLATIONS:
        with playtest.ablated(model, name):
            report[f"ablated_{name}"] = play(model, seconds=args.seconds, seed=args.seed)[0]
    report["wall_s"] = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tinyworld3.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
