"""A Dreamverse project on `WS /ws`: its seed prompts, rollouts, segment cap and the rule-based rewrite.

Dreamverse (FastVideo `apps/dreamverse`, `dreamverse/session/controller.py`) keeps per socket a *project*:
a window of seed prompts played one segment each, in *rollouts* (each announced by `ltx2_stream_start`,
numbered by `loop_iteration`), capped at `generation_segment_cap` segments per rollout, and rewritten by an
LLM on `rewrite_seed_prompts`. worldcast has no LLM: the rewrite here is a rule (`rewrite_window`), stated
in docs/streaming.md. This module holds the project's state and rules; `transport/dreamverse.py` speaks
the protocol around it. Nothing here touches a session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from worldcast.transport.schemas import MAX_PROMPT_CHARS, check_prompt

#: Seed prompts a project holds, at most (session_init_v2's curated prompts, a rewritten window).
MAX_CURATED_PROMPTS = 64
#: Prompts in a window written from one instruction alone (Dreamverse's client pads the windows it sends
#: for a rewrite to this many: `REWRITE_SEGMENT_COUNT` in `web/src/lib/prompts/promptWindowSnapshot.ts`).
REWRITE_SEGMENTS = 6
#: The `model` named in rewrite events: the rule below, not a language model.
REWRITE_MODEL = "worldcast-rules"
#: Segments per rollout before `ltx2_stream_complete` (Dreamverse's FASTVIDEO_GENERATION_SEGMENT_CAP
#: default is 6 too); 0: no cap.
DEFAULT_SEGMENT_CAP = 6


class PromptError(ValueError):
    """A prompt Dreamverse would send that worldcast cannot use (blank, control characters)."""


def clean_prompt(text: object) -> tuple[str, bool]:
    """A Dreamverse prompt as worldcast takes it: `check_prompt`'s rule, then at most MAX_PROMPT_CHARS
    (cut at a word).

    Returns:
        (prompt, whether it was shortened).

    Raises:
        PromptError: not a string, or refused by `check_prompt` (no visible text, control or bidi characters).
    """
    if not isinstance(text, str):
        raise PromptError(f"prompt must be a string, got {type(text).__name__}")
    try:
        p = check_prompt(text)
    except ValueError as e:
        raise PromptError(str(e)) from None
    assert p is not None
    if len(p) <= MAX_PROMPT_CHARS:
        return p, False
    cut = p[:MAX_PROMPT_CHARS]
    return (cut.rsplit(" ", 1)[0] if " " in cut[MAX_PROMPT_CHARS // 2:] else cut), True


def clean_window(raw: object, what: str) -> list[str]:
    """A list of prompts from a client message: blank entries skipped (as Dreamverse does), the rest cleaned.

    Raises:
        PromptError: `raw` is not a list, an entry is not a usable prompt (named by its position), or there
            are more than MAX_CURATED_PROMPTS entries.
    """
    if not isinstance(raw, list):
        raise PromptError(f"{what} must be a list of strings, got {type(raw).__name__}")
    if len(raw) > MAX_CURATED_PROMPTS:
        raise PromptError(f"{what} holds {len(raw)} prompts; at most {MAX_CURATED_PROMPTS}")
    out = []
    for i, p in enumerate(raw):
        if isinstance(p, str) and not p.strip():
            continue
        try:
            out.append(clean_prompt(p)[0])
        except PromptError as e:
            raise PromptError(f"{what}[{i}]: {e}") from None
    return out


def rewrite_window(instruction: str | None, window: list[str], played: int) -> list[str]:
    """The rule-based `rewrite_seed_prompts` (no language model): the instruction becomes the next
    direction, the window's prompts are kept after it.

    Args:
        instruction: the composer's text (None: a rewrite without one).
        window: the client's prompt window (`prompt_window_prompts`, already cleaned), or the project's
            seeds when it sent none.
        played: how many of `window`'s first prompts the current rollout has already started (they are
            not replayed after the instruction).

    Returns:
        the new window, played from its first prompt: without an instruction the window itself; with one,
        `[instruction] + window[played:]`, filled with the instruction up to REWRITE_SEGMENTS prompts (a
        scene continues under the same direction), at most MAX_CURATED_PROMPTS.
    """
    if instruction is None:
        return list(window[:MAX_CURATED_PROMPTS])
    out = [instruction] + [p for p in window[played:] if p != instruction]
    out += [instruction] * (REWRITE_SEGMENTS - len(out))
    return out[:MAX_CURATED_PROMPTS]


@dataclass
class ProjectInit:
    """What `session_init_v2` / `project_init_v1` ask for (FastVideo `buildProjectInitPayload` in
    `web/src/app/page.tsx`: preset_id, preset_label, curated_prompts, initial_rollout_prompt, initial_image,
    single_clip_mode, enhancement_enabled, auto_extension_enabled, loop_generation_enabled)."""

    prompts: list[str]  #: usable curated prompts
    initial_prompt: str | None  #: a custom start's prompt (no curated prompts): rewritten into the seeds
    preset_id: Any = None
    preset_label: str = ""
    enhancement: bool = True
    auto_extension: bool = False
    loop: bool = False
    errors: list[str] = field(default_factory=list)  #: why entries were skipped (sent as `error` events)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> ProjectInit:
        """Read an init message leniently, as Dreamverse does: unusable curated prompts are skipped (and
        reported in `errors`), flags default as in Dreamverse (enhancement on, the rest off)."""
        raw = data.get("curated_prompts")
        raw = raw if isinstance(raw, list) else []
        prompts, errors = [], []
        for i, p in enumerate(raw[:MAX_CURATED_PROMPTS]):
            if isinstance(p, str) and not p.strip():
                continue  # Dreamverse skips blank entries too
            try:
                prompts.append(clean_prompt(p)[0])
            except PromptError as e:
                errors.append(f"curated prompt {i + 1} skipped: {e}")
        if len(raw) > MAX_CURATED_PROMPTS:
            errors.append(f"only the first {MAX_CURATED_PROMPTS} curated prompts are used")
        initial = None
        ip = data.get("initial_rollout_prompt")
        if not prompts and isinstance(ip, str) and ip.strip():
            try:
                initial = clean_prompt(ip)[0]
            except PromptError as e:
                errors.append(f"initial_rollout_prompt skipped: {e}")
        label = data.get("preset_label")

        def flag(key: str, default: bool) -> bool:
            v = data.get(key, default)
            return v if isinstance(v, bool) else default

        return cls(prompts, initial, data.get("preset_id"), label.strip()[:200] if isinstance(label, str) else "",
                   flag("enhancement_enabled", True), flag("auto_extension_enabled", False),
                   flag("loop_generation_enabled", False), errors)


NextKind = Literal["seed", "loop", "auto", "blocked", "capped", "idle"]


@dataclass
class Project:
    """One project's state: seeds, the rollout under way and its count against the cap.

    Attributes:
        seeds: the seed prompts (the client's prompt window).
        next_seed: index of the seed the next segment plays.
        rollout: the rollout number (`loop_iteration`), 1 for a project's first.
        started: segments started in this rollout (against `cap`).
        cap: segments per rollout (0: none).
        capped: the rollout reached its cap and `ltx2_stream_complete` was sent.
        active: a project is under way (False after `end_project_keep_session` until `project_init_v1`).
        last_prompt: the prompt of the last segment started (auto-extension continues it).
    """

    cap: int = DEFAULT_SEGMENT_CAP
    seeds: list[str] = field(default_factory=list)
    next_seed: int = 0
    rollout: int = 0
    started: int = 0
    capped: bool = False
    active: bool = False
    preset_id: Any = None
    preset_label: str = ""
    enhancement: bool = True
    auto_extension: bool = False
    loop: bool = False
    last_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.cap < 0:
            raise ValueError(f"segment cap must be >= 0, got {self.cap}")

    def begin(self, init: ProjectInit) -> None:
        """Start a project: its seeds (the custom prompt's rewrite, or the curated prompts) and flags."""
        self.seeds = rewrite_window(init.initial_prompt, [], 0) if init.initial_prompt else list(init.prompts)
        self.preset_id = init.preset_id if init.preset_id is not None else ("custom" if init.initial_prompt else None)
        self.preset_label = init.preset_label or ("Custom rollout" if init.initial_prompt else "")
        self.enhancement, self.auto_extension, self.loop = init.enhancement, init.auto_extension, init.loop
        self.active, self.rollout, self.last_prompt = True, 0, None
        self.new_rollout()

    def end(self) -> None:
        """End the project (`end_project_keep_session`): nothing plays until the next `begin`."""
        self.active, self.seeds, self.next_seed, self.capped = False, [], 0, False

    def new_rollout(self, seeds: list[str] | None = None) -> None:
        """Start a rollout (seeds from the first, a fresh count against the cap), optionally on new seeds."""
        if seeds is not None:
            self.seeds = list(seeds)
        self.rollout += 1
        self.next_seed, self.started, self.capped = 0, 0, False

    @property
    def at_cap(self) -> bool:
        """This rollout has started `cap` segments."""
        return self.cap > 0 and self.started >= self.cap

    def next_kind(self) -> NextKind:
        """What the next segment would be: a seed, a loop restart (seeds exhausted, loop on), an
        auto-extension (seeds exhausted, auto-extension on: the last prompt continues), blocked (waits for
        a prompt), capped (the rollout is complete) or idle (no project)."""
        if not self.active:
            return "idle"
        if self.at_cap or self.capped:
            return "capped"
        if self.next_seed < len(self.seeds):
            return "seed"
        if self.loop and self.seeds:
            return "loop"
        if self.auto_extension and self.last_prompt is not None:
            return "auto"
        return "blocked"

    def take_seed(self) -> tuple[str, int]:
        """The next seed prompt and its index (call when `next_kind()` is "seed")."""
        i = self.next_seed
        self.next_seed += 1
        return self.seeds[i], i

    def window_played(self, window: list[str]) -> int:
        """How many of `window`'s first prompts this rollout has started (0 unless `window` begins with
        this rollout's seeds: a window from an archived clip is taken whole)."""
        k = min(self.next_seed, len(self.seeds))
        return k if window[:k] == self.seeds[:k] else 0
