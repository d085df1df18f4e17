"""The leave-and-return test: walk away until the view has left the screen, come back, and compare.

    python -m worldcast.models.tinyworld.evaluate --only revisit     # this part of `make evaluate` alone

Each world is played through the served path (`playtest.served_rollout`: the engine's rollout, the state
pool, the model's sampler, in the way the warm-up chose) on held-out map seeds by five scripts: still,
then out and back by the same keys reversed, then still:

- ``left-right``: D until the view is 1.5 views away, A as long;
- ``up-down``: W, then S;
- ``square``: D, S, A, W with Shift, 1.5 views a side;
- ``diagonal``: W+D with Shift, then S+A with Shift;
- ``beyond-reach``: D with Shift for 20 views, A with Shift as long: past the memory's reach
  (`memory.MEMORY_VIEWS`), so the place is forgotten and painted anew.

For each, the view just before leaving against the view after the return (the marker masked): the share of
pixels identical in every channel, and the normalised cross-correlation of their luminance; the simulator (a
fixed map) gives 1 for both, a model that forgets about 0. Each is measured twice, with the world memory's
recall on and off (`TinyWorldModel.recall_memory`): the ablation that says what the memory does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from worldcast.models.base import WorldModel
from worldcast.models.tinyworld import playtest, world
from worldcast.models.tinyworld.network import marker_mask

logger = logging.getLogger(__name__)

FPS = playtest.FPS
#: Map seeds of this test (held out from training, the play test and the tuning seeds).
MAP_SEED_BASE = 4_000_000
#: The scripts: name -> legs of (keys held, frames); each starts and ends with a still second.
SCRIPTS: dict[str, list[tuple[tuple[str, ...], int]]] = {
    "left-right": [(("d",), 48), (("a",), 48)],
    "up-down": [(("w",), 48), (("s",), 48)],
    "square": [(("d", "shift"), 24), (("s", "shift"), 24), (("a", "shift"), 24), (("w", "shift"), 24)],
    "diagonal": [(("w", "d", "shift"), 24), (("s", "a", "shift"), 24)],
    "beyond-reach": [(("d", "shift"), 320), (("a", "shift"), 320)],
}


def script_actions(legs: list[tuple[tuple[str, ...], int]]) -> tuple[np.ndarray, int, int]:
    """float32 (N, ACTION_DIM) actions of a script (frame 0: none), and the frames just before leaving and just
    after the return."""
    rows = [np.zeros(world.ACTION_DIM, np.float32)] * (1 + FPS)
    leave = len(rows) - 1
    for keys, frames in legs:
        rows += [world.action_vector({k: True for k in keys}, (0.0, 0.0))] * frames
    back = len(rows) - 1
    rows += [np.zeros(world.ACTION_DIM, np.float32)] * FPS
    return np.stack(rows), leave, back


def compare(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """Identical share and luminance NCC of two uint8 (S, S, 3) views over the non-marker pixels."""
    keep = ~marker_mask(before.shape[0]).numpy()
    same = float((before == after).all(-1)[keep].mean())
    lum = lambda x: (x.astype(np.float64) @ [0.299, 0.587, 0.114])[keep]  # noqa: E731
    a, b = lum(before), lum(after)
    a, b = a - a.mean(), b - b.mean()
    ncc = float(a @ b / (np.sqrt((a @ a) * (b @ b)) + 1e-9))
    return {"identical_share": round(same, 4), "ncc": round(ncc, 3)}


def run(model: WorldModel, *, themes: tuple[str, ...] = world.THEMES, scripts: tuple[str, ...] = tuple(SCRIPTS),
        captions: dict[str, list[str]] | None = None) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Every script in every world (or those named), memory recall on and off (module doc).

    Returns:
        ({script: {theme: {"memory": compare, "no_memory": compare, "simulator": compare}}, "summary": ...},
        {theme: uint8 (3, 3, S, S, 3) the left-right script's views before leaving, away and after the return,
        simulator / model / model without memory}).
    """
    if captions is None:
        from worldcast.models.tinyworld.prompts import TRAIN_CAPTIONS

        captions = {t: list(c) for t, c in TRAIN_CAPTIONS.items()}
    out: dict[str, dict[str, object]] = {}
    pictures: dict[str, np.ndarray] = {}
    for name in scripts:
        acts, leave, back = script_actions(SCRIPTS[name])
        per: dict[str, object] = {}
        for w, theme in enumerate(themes):
            seed = MAP_SEED_BASE + w
            prompt = model.encode_prompt(captions[theme][0])
            shown = model.theme_for(prompt)  # type: ignore[attr-defined]
            sim = playtest.simulate_script(seed, shown, acts)
            res = {"simulator": compare(sim[leave], sim[back])}
            views = []
            for on in (True, False):
                model.recall_memory = on  # type: ignore[attr-defined]
                try:
                    frames = playtest.served_rollout(model, seed, prompt, acts)
                finally:
                    model.recall_memory = True  # type: ignore[attr-defined]
                res["memory" if on else "no_memory"] = compare(frames[leave], frames[back])
                views.append(frames)
            per[theme] = res
            if name == "left-right":
                mid = (leave + back) // 2
                pictures[theme] = np.stack([np.stack([v[leave], v[mid], v[back]]) for v in (sim, *views)])
            logger.info("revisit %s %s: %s", name, theme, res)
        out[name] = per
    summary = {}
    for name, per in out.items():
        vals = list(per.values())
        summary[name] = {k: {"identical_share": [min(v[k]["identical_share"] for v in vals),  # type: ignore[index]
                                                 max(v[k]["identical_share"] for v in vals)],  # type: ignore[index]
                             "ncc": [min(v[k]["ncc"] for v in vals), max(v[k]["ncc"] for v in vals)]}  # type: ignore[index]
                         for k in ("memory", "no_memory", "simulator")}
    return {"scripts": out, "summary": summary, "map_seed_base": MAP_SEED_BASE}, pictures


def save_picture(path: Path, pictures: dict[str, np.ndarray]) -> None:
    """PNG: per world (a row), the left-right script's views of the simulator (before leaving, away, back), the
    model's (the same three) and the model's on return with its memory's recall off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [("simulator\nbefore leaving", 0, 0), ("simulator\naway", 0, 1), ("simulator\nback", 0, 2),
            ("model\nbefore leaving", 1, 0), ("model\naway", 1, 1), ("model\nback", 1, 2),
            ("no memory\nback", 2, 2)]
    fig, axes = plt.subplots(len(pictures), len(cols), figsize=(len(cols) * 1.2, len(pictures) * 1.25),
                             squeeze=False)
    for r, (theme, v) in enumerate(pictures.items()):
        for c, (title, who, k) in enumerate(cols):
            axes[r, c].imshow(v[who, k])
            axes[r, c].set_xticks([]), axes[r, c].set_yticks([])
            if r == 0:
                axes[r, c].set_title(title, fontsize=7)
        axes[r, 0].set_ylabel(theme, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
