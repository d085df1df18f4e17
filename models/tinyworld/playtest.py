"""The play test: TinyWorld played as a user plays it, through the served path, and judged by its pictures.

    python -m worldcast.models.tinyworld.evaluate --minutes 5     # runs this first; `make evaluate`

Every world (all six themes) is played for `minutes` unbroken minutes by a scripted random
player (held keys, Shift, mouse pans, still spells, Space; `player_script`) on a held-out map
seed, as one session of the engine's rollout (`engine/rollout.py`: the state pool, ring
attention, the model's sampler) in the precision and compiled way the engine's warm-up
chooses on this machine (`engine/tuning/warmup.measure_precisions`), while the simulator plays the
same script from the same view. At minute 1 and at the last minute, over the 20 s ending there:

- alive: the frames' texture (mean |Laplacian| of luminance) and object share
  (`picture.py`) are each within 0.5x-2x of the simulator's, per world;
- answers every key: in each held-input second (one key or pan held for the whole second and
  four frames beyond, the simulator's camera moving >= 1 px a frame), the camera shift
  measured from the pictures (phase correlation of frames k and k + 4, the marker masked;
  the median over the second) points the way the simulator's does (within 25 degrees) with a
  magnitude within 25 % of it, in at least 90 % of those seconds, over the worlds.

A world that has gone flat fails both: nothing to correlate, so no measured shift, and
texture and objects far below the simulator's (`tests/models/test_playtest.py` shows a frozen
and a flat video failing, and the simulator passing against itself).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worldcast.models.base import WorldModel
from worldcast.models.tinyworld import picture, world

logger = logging.getLogger(__name__)

FPS = 20
#: Seconds of each measured window (ending at the minute).
WINDOW_S = 20
#: Frames apart of the two frames whose camera shift is measured (frames k and k + 4).
SHIFT_GAP = 4
#: The bars: alive ratio band, the share of held-input seconds that must answer, angle and magnitude tolerances.
ALIVE_BAND = (0.5, 2.0)
ANSWER_SHARE = 0.9
MAX_ANGLE_DEG = 25.0
MAX_MAGNITUDE_ERR = 0.25
#: Map seeds of the play test (held out: training uses seeds below 1000, the rollout evaluation 1,000,000 on).
MAP_SEED_BASE = 2_000_000
#: Map seeds the serving sampler's settings are tuned on (`main`): neither trained on nor judged by the play test.
TUNING_SEED_BASE = 3_000_000


@dataclass(frozen=True)
class Segment:
    """One held input of the scripted player: frames [start, end), its action, what kind it is."""

    start: int
    end: int
    action: np.ndarray
    kind: str  #: "still", "key" or "pan"


def player_script(rng: np.random.Generator, frames: int) -> tuple[np.ndarray, list[Segment]]:
    """A random player's inputs for `frames` + 1 frames (frame 0 is the start: no action).

    Segments of 1-3 s: 15 % still, 15 % a constant mouse pan (1-4 px a frame on each axis, not both
    zero), 70 % a movement key (W/A/S/D, a quarter of W/S with A or D too, 30 % with Shift); Space is
    held in 10 % of segments.

    Returns:
        float32 (frames + 1, ACTION_DIM) action vectors (`world.action_vector` layout) and the segments.
    """
    acts = np.zeros((frames + 1, world.ACTION_DIM), np.float32)
    segs: list[Segment] = []
    i = 1
    n_keys = len(world.KEYS)
    while i <= frames:
        length = int(rng.integers(FPS, 3 * FPS + 1))
        a = np.zeros(world.ACTION_DIM, np.float32)
        r = rng.random()
        if r < 0.15:
            kind = "still"
        elif r < 0.30:
            kind = "pan"
            pan = np.zeros(2)
            while not pan.any():
                pan = rng.integers(-world.MAX_PAN_PX, world.MAX_PAN_PX + 1, size=2)
            a[n_keys:n_keys + 2] = pan / world.MAX_PAN_PX
        else:
            kind = "key"
            k = int(rng.integers(0, 4))  # w, a, s, d
            a[k] = 1.0
            if k in (0, 2) and rng.random() < 0.25:
                a[world.KEYS.index("a") if rng.random() < 0.5 else world.KEYS.index("d")] = 1.0
            a[world.KEYS.index("shift")] = 1.0 if rng.random() < 0.3 else 0.0
        a[world.KEYS.index("space")] = 1.0 if rng.random() < 0.1 else 0.0
        end = min(frames + 1, i + length)
        acts[i:end] = a
        segs.append(Segment(i, end, a, kind))
        i = end
    return acts, segs


def simulate_script(seed: int, theme: str, actions: np.ndarray) -> np.ndarray:
    """The simulator's frames for `actions` from the origin of map `seed`: uint8 (N, S, S, 3), frame 0 first
    (the view a session of that seed starts from, `TinyWorldModel.initial_frames`)."""
    wm = world.WorldMap.generate(seed)
    st = world.WorldState(wm, theme, 0, 0)
    out = [world.render_view(wm, theme, 0, 0)]
    out += [world.step(st, a) for a in actions[1:]]
    return np.stack(out)


def choose_way(model: WorldModel, *, compile_steps: bool) -> dict[str, object]:
    """Run the engine's warm-up choice of precision and compiled steps at batch 1 on `model` (left in that way)."""
    from worldcast.engine.tuning.compiled import StepCompiler
    from worldcast.engine.tuning.warmup import measure_precisions

    compiler = StepCompiler(model.device, buckets=(1,), enabled=compile_steps)
    choice = measure_precisions(model, compiler)
    logger.info("served way: %s", choice.describe())
    return {"dtype": choice.dtype, "compiled": choice.compiled, "way": choice.describe()}


def served_rollout(model: WorldModel, seed: int, prompt: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """One session through the engine's rollout: uint8 (N, S, S, 3), the initial frame first.

    The session's seed picks its map (and its noise), as a served session's does; `actions[i]` is sampled
    for frame i (actions[0] by the initial commit, which applies none: the initial frame is the simulator's
    view).
    """
    from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
    from worldcast.engine.scripted import ScriptedConditioner
    from worldcast.engine.state_pool import StatePool

    spec = model.spec
    it = iter(actions)
    cond = ScriptedConditioner(spec, action=lambda: next(it), context={"prompt": prompt})
    pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session(), device=model.device)
    r = ChunkRollout(f"playtest{seed}", model, pool, cond, seed=seed)
    out = np.zeros((len(actions), spec.frame_height, spec.frame_width, 3), np.uint8)
    try:
        out[0] = r.init(0.0)[0].image
        cache = BatchCache()
        for i in range(1, len(actions)):
            out[i] = run_chunk_batch([r], cache)[0].image
    finally:
        r.close()
    return out


def shift_per_frame(frames: np.ndarray, start: int) -> np.ndarray:
    """The camera's displacement per frame over the second from `start`: the median over k (every other frame)
    of camera_shift(frames[k], frames[k + SHIFT_GAP]) / SHIFT_GAP, float64 (2,) pixels (+x right, +y down)."""
    shifts = [picture.camera_shift(frames[k], frames[k + SHIFT_GAP])[0] for k in range(start, start + FPS, 2)]
    return np.median(np.asarray(shifts, np.float64), axis=0) / SHIFT_GAP


def held_input_seconds(segs: list[Segment], lo: int, hi: int) -> list[int]:
    """First frames of the whole seconds of the session clock within [lo, hi) during which one key or pan is
    held from that frame to SHIFT_GAP frames past the second."""
    out = []
    for s in segs:
        if s.kind == "still":
            continue
        first = max(s.start, lo)
        first += (-first) % FPS
        while first + FPS + SHIFT_GAP <= min(s.end, hi):
            out.append(first)
            first += FPS
    return out


def window_stats(model_frames: np.ndarray, sim_frames: np.ndarray, theme: str, segs: list[Segment], lo: int,
                 hi: int) -> dict[str, object]:
    """One world's window of frames [lo, hi): texture and object share of model and simulator (means), and each
    held-input second's measured shifts (px a frame) and verdict."""
    m, s = model_frames[lo:hi], sim_frames[lo:hi]
    out: dict[str, object] = {
        "texture": float(picture.texture(m).mean()), "sim_texture": float(picture.texture(s).mean()),
        "objects": float(picture.object_share(m, theme).mean()),
        "sim_objects": float(picture.object_share(s, theme).mean()),
    }
    seconds = []
    for k in held_input_seconds(segs, lo, hi):
        dm, ds = shift_per_frame(model_frames, k), shift_per_frame(sim_frames, k)
        if np.linalg.norm(ds) < 1.0:
            continue  # the simulator's camera hardly moved (a pan that cancels a key): nothing to answer
        cos = float(dm @ ds / (np.linalg.norm(dm) * np.linalg.norm(ds) + 1e-9))
        err = float(abs(np.linalg.norm(dm) / np.linalg.norm(ds) - 1))
        ok = cos >= math.cos(math.radians(MAX_ANGLE_DEG)) and err <= MAX_MAGNITUDE_ERR
        seconds.append({"second": k / FPS, "model_px_per_frame": dm.round(2).tolist(),
                        "sim_px_per_frame": ds.round(2).tolist(), "answered": ok})
    out["held_input_seconds"] = seconds
    return out


def judge(per_world: dict[str, dict[str, object]], key: str) -> dict[str, object]:
    """The bars at one mark (`key`, e.g. "minute_1") over the worlds in `per_world` (theme -> its marks)."""
    ratios = {}
    answered, total = 0, 0
    for theme, marks in per_world.items():
        st = marks[key]
        ratios[theme] = {"texture": st["texture"] / max(st["sim_texture"], 1e-9),  # type: ignore[index]
                         "objects": st["objects"] / max(st["sim_objects"], 1e-9)}  # type: ignore[index]
        answered += sum(s["answered"] for s in st["held_input_seconds"])  # type: ignore[index]
        total += len(st["held_input_seconds"])  # type: ignore[index]
    lo, hi = ALIVE_BAND
    return {"ratios_to_simulator": ratios,
            "alive": all(lo <= r <= hi for v in ratios.values() for r in v.values()),
            "held_input_seconds": total, "answered_share": answered / max(total, 1),
            "answers_every_key": total > 0 and answered / total >= ANSWER_SHARE}


@contextlib.contextmanager
def ablated(model: WorldModel, name: str | None) -> Iterator[None]:
    """Serve `model` (a TinyWorld) under ablation `name` (one of its `ABLATIONS`; None: as it is) inside the block,
    with eager steps (a compiled step bakes in what it traced; the model is left eager afterwards).

    Raises:
        ValueError: an ablation the model does not have.
    """
    if name is None:
        yield
        return
    names = getattr(model, "ABLATIONS", ())
    if name not in names:
        raise ValueError(f"unknown ablation {name!r}; {type(model).__name__} has {names}")
    model.compile_steps(None)
    try:
        model.set_ablation(name)  # type: ignore[attr-defined]
        yield
    finally:
        model.set_ablation(None)  # type: ignore[attr-defined]


def play_worlds(model: WorldModel, *, minutes: int, seed: int, captions: dict[str, list[str]] | None = None,
                map_seed_base: int = MAP_SEED_BASE) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Play every world for `minutes` minutes through the served path (module docstring).

    Args:
        model: a TinyWorld, left in the way it serves (`choose_way`).
        minutes: unbroken minutes per world (>= 1).
        seed: the player scripts' seed.
        captions: theme -> captions, the first of which prompts that world (default: `prompts.TRAIN_CAPTIONS`).
        map_seed_base: world w is played on map seed map_seed_base + w.

    Returns:
        ({"worlds": per world and mark the window statistics, "bars": per mark `judge`}, theme -> uint8
        (2, N, S, S, 3) simulator and model videos).

    Raises:
        ValueError: minutes < 1.
    """
    if minutes < 1:
        raise ValueError(f"the play test runs at least a minute per world, not {minutes}")
    if captions is None:
        from worldcast.models.tinyworld.prompts import TRAIN_CAPTIONS

        captions = {t: list(c) for t, c in TRAIN_CAPTIONS.items()}
    rng = np.random.default_rng(seed)
    n = minutes * 60 * FPS
    marks = sorted({1, minutes})
    per_world: dict[str, dict[str, object]] = {}
    videos: dict[str, np.ndarray] = {}
    for w, theme in enumerate(world.THEMES):
        actions, segs = player_script(rng, n)
        map_seed = map_seed_base + w
        prompt = model.encode_prompt(captions[theme][0])
        shown = model.theme_for(prompt)  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        frames = served_rollout(model, map_seed, prompt, actions)
        wall = time.perf_counter() - t0
        sim = simulate_script(map_seed, shown, actions)
        logger.info("play test: %s, %d frames served in %.0f s", theme, n, wall)
        per_world[theme] = {"map_seed": map_seed, "shown_theme": shown, "served_frames_per_s": n / wall,
                            **{f"minute_{mk}": window_stats(frames, sim, theme, segs, mk * 60 * FPS - WINDOW_S * FPS,
                                                            mk * 60 * FPS + 1) for mk in marks}}
        videos[theme] = np.stack([sim, frames])
    return {"worlds": per_world, "bars": {f"minute_{mk}": judge(per_world, f"minute_{mk}") for mk in marks}}, videos


def save_pairs(path: Path, rows: list[tuple[str, list[np.ndarray], list[np.ndarray]]], titles: list[str],
               *, cell_in: float = 1.3) -> None:
    """PNG: per row, the simulator's frames above the model's, one column per title.

    Args:
        rows: (label, simulator frames, model frames), each frame uint8 (S, S, 3), as many as `titles`.
        cell_in: inches per picture.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2 * len(rows), len(titles), figsize=(len(titles) * cell_in, 2 * len(rows) * cell_in),
                             squeeze=False)
    for r, (label, sim, model) in enumerate(rows):
        for c, title in enumerate(titles):
            axes[2 * r, c].imshow(sim[c])
            axes[2 * r + 1, c].imshow(model[c])
            if r == 0:
                axes[0, c].set_title(title, fontsize=8)
        axes[2 * r, 0].set_ylabel(label, fontsize=7)
        axes[2 * r + 1, 0].set_ylabel("model", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_worlds(path: Path, videos: dict[str, np.ndarray], seconds: list[float]) -> None:
    """PNG: per world, the simulator above the model at `seconds` (clipped to the video's length)."""
    rows = []
    for theme, v in videos.items():
        ks = [min(int(s * FPS), v.shape[1] - 1) for s in seconds]
        rows.append((f"{theme}\nsimulator", [v[0, k] for k in ks], [v[1, k] for k in ks]))
    save_pairs(path, rows, [f"{s:g} s" for s in seconds])


def main(argv: list[str] | None = None) -> int:
    """Tune the serving sampler's settings on the tuning seeds: the play test's bars per world, printed as JSON.

        python -m worldcast.models.tinyworld.playtest --draw-sigma 4 --terrain-sigma 2 --object-offset 0 \
            --terrain-scale 0.155

    (`network.DRAW_SIGMA_PX`, `network.TERRAIN_SIGMA_PX`, `network.DRAW_LOGIT_OFFSET`,
    `network.TERRAIN_DRAW_SCALE`.) The play test itself
    (`evaluate.py`) runs on other seeds, so the settings are not chosen on the numbers that judge them.
    """
    import argparse
    import json

    import torch

    from worldcast.models.tinyworld.model import DEFAULT_WEIGHTS, TinyWorldModel

    ap = argparse.ArgumentParser(prog="python -m worldcast.models.tinyworld.playtest",
                                 description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--minutes", type=int, default=5)
    ap.add_argument("--map-seed-base", type=int, default=TUNING_SEED_BASE)
    ap.add_argument("--seed", type=int, default=1, help="the player scripts' seed (the play test uses 0)")
    ap.add_argument("--draw-sigma", type=float, default=None, help="px; default network.DRAW_SIGMA_PX")
    ap.add_argument("--terrain-sigma", type=float, default=None, help="px; default network.TERRAIN_SIGMA_PX")
    ap.add_argument("--object-offset", type=float, default=None, help="default network.DRAW_LOGIT_OFFSET")
    ap.add_argument("--terrain-scale", type=float, default=None, help="default network.TERRAIN_DRAW_SCALE")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--ablate", default=None, metavar="NAME",
                    help="play under one of the model's ablations (eager steps; TinyWorld 2: constants, "
                         "network-alone; TinyWorld 3: constant, edge)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    model = TinyWorldModel.from_pretrained(args.weights)
    if args.draw_sigma is not None:
        model.net.draw_sigma_px = args.draw_sigma
    if args.terrain_sigma is not None:
        model.net.terrain_sigma_px = args.terrain_sigma
    if args.object_offset is not None:
        model.net.draw_logit_offset = args.object_offset
    if args.terrain_scale is not None:
        model.net.terrain_draw_scale = args.terrain_scale
    choose_way(model, compile_steps=not args.no_compile)
    with ablated(model, args.ablate):
        played, _ = play_worlds(model, minutes=args.minutes, seed=args.seed, map_seed_base=args.map_seed_base)
    bars = played["bars"]
    print(json.dumps({"draw_sigma_px": model.net.draw_sigma_px, "terrain_sigma_px": model.net.terrain_sigma_px,
                      "draw_logit_offset": model.net.draw_logit_offset,
                      "terrain_draw_scale": model.net.terrain_draw_scale, "map_seed_base": args.map_seed_base,
                      "ablation": args.ablate,
                      "seed": args.seed, "bars": bars}, indent=2))
    return 0 if all(b["alive"] and b["answers_every_key"] for b in bars.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
