"""Dreamverse's prompts as worldcast takes them: one prompt, a prompt window, an init message.

The project rules these feed (seeds, rollouts, the cap, the rule-based rewrite) are in `sessions/projects.py`;
`transport/dreamverse/connection.py` speaks the protocol around them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worldcast.sessions.projects import MAX_SEEDS, ProjectStart
from worldcast.transport.errors import PromptError
from worldcast.transport.schemas import MAX_PROMPT_CHARS, check_prompt

#: Curated prompts taken from an init message, and prompts in a rewrite's window, at most.
MAX_CURATED_PROMPTS = MAX_SEEDS
#: The `model` named in rewrite events: `sessions.projects.rewrite_window`, a rule, not a language model.
REWRITE_MODEL = "worldcast-rules"


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


@dataclass
class ProjectInit(ProjectStart):
    """What `session_init_v2` / `project_init_v1` ask for (FastVideo `buildProjectInitPayload` in
    `web/src/app/page.tsx`: preset_id, preset_label, curated_prompts, initial_rollout_prompt, initial_image,
    single_clip_mode, enhancement_enabled, auto_extension_enabled, loop_generation_enabled)."""

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
