"""Directing projects: a window of seed prompts played one segment each, in rollouts, under a segment cap.

The rules above segments (`sessions/directing.py`) that a directing app's protocol applies (FastVideo
Dreamverse's, `transport/dreamverse/connection.py`, follows `apps/dreamverse/dreamverse/session/controller.py`): a
*project* holds seed prompts; a *rollout* plays them from the first, one segment each, and ends after `cap`
segments; loop generation replays them, auto-extension continues the last prompt; a rewrite (here a rule,
`rewrite_window`: no language model) writes the instruction into every seed and starts a new rollout. Pure
state: nothing here touches a session or a socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: Seed prompts a project holds, at most.
MAX_SEEDS = 64
#: Prompts in a window written from one instruction alone (Dreamverse's client pads the windows it sends
#: for a rewrite to this many: `REWRITE_SEGMENT_COUNT` in `web/src/lib/prompts/promptWindowSnapshot.ts`).
REWRITE_SEGMENTS = 6
#: Segments per rollout before it is complete (Dreamverse's FASTVIDEO_GENERATION_SEGMENT_CAP default is 6
#: too); 0: no cap.
DEFAULT_SEGMENT_CAP = 6


#: The rewrite's rule, as the Dreamverse client is told it (`/prompt-system-config`, `seed_prompts_updated`).
REWRITE_RULE = ("worldcast has no language model: a rewrite instruction replaces every prompt of the window "
                f"(at least {REWRITE_SEGMENTS}), so each segment of the rollout plays it; without an instruction "
                "the window plays again from its first prompt.")


def rewrite_window(instruction: str | None, window: list[str]) -> list[str]:
    """The rule-based `rewrite_seed_prompts` (no language model, `REWRITE_RULE`): the instruction is written
    into every prompt of the window, as Dreamverse's rewrite (a language model asked to rewrite the whole
    window) and its mock server do, so an edit never reverts to an old prompt a segment later.

    Args:
        instruction: the composer's text (None: a rewrite without one).
        window: the client's prompt window (`prompt_window_prompts`, already cleaned), or the project's
            seeds when it sent none.

    Returns:
        the new window, played from its first prompt: without an instruction the window itself; with one,
        the instruction as each of the window's prompts, at least REWRITE_SEGMENTS of them (Dreamverse's
        client pads its windows to that many) and at most MAX_SEEDS.
    """
    if instruction is None:
        return list(window[:MAX_SEEDS])
    return [instruction] * min(MAX_SEEDS, max(REWRITE_SEGMENTS, len(window)))


@dataclass
class ProjectStart:
    """What a project starts from: curated prompts, or a custom start's prompt, and its flags."""

    prompts: list[str]  #: the seed prompts, as given
    initial_prompt: str | None  #: a custom start's prompt (no curated prompts): rewritten into the seeds
    preset_id: Any = None
    preset_label: str = ""
    enhancement: bool = True
    auto_extension: bool = False
    loop: bool = False


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

    def begin(self, init: ProjectStart) -> None:
        """Start a project: its seeds (the custom prompt's rewrite, or the curated prompts) and flags."""
        self.seeds = rewrite_window(init.initial_prompt, []) if init.initial_prompt else list(init.prompts)
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
