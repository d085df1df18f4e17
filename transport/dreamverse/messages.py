"""Checking the messages of Dreamverse's client on `WS /ws`: each becomes a request, or a precise refusal.

The message types and fields are those FastVideo's client sends (`apps/dreamverse/web/src/app/page.tsx`);
`transport/dreamverse/connection.py` acts on the requests. A refused message changes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from worldcast.sessions.projects import Project
from worldcast.transport.dreamverse.prompts import ProjectInit, clean_prompt, clean_window
from worldcast.transport.errors import PromptError, Refused

#: Dreamverse message types not served (they need a language model or Dreamverse's simple mode).
UNSUPPORTED = frozenset({"simple_generate", "set_rewrite_temperature", "select_model"})
SUPPORTED = ("project_init_v1", "end_project_keep_session", "append_prompt", "rewrite_seed_prompts",
             "reset_to_seed_prompts", "set_generation_paused", "set_loop_generation", "set_auto_extension",
             "set_enhancement", "set_rewrite_model", "restart_generation", "leave")
#: Toggles: message type -> (`Project` attribute, the ack's type).
TOGGLES = {"set_loop_generation": ("loop", "loop_generation_updated"),
           "set_auto_extension": ("auto_extension", "auto_extension_updated"),
           "set_enhancement": ("enhancement", "enhancement_updated")}
#: Types that need an active project.
NEEDS_PROJECT = frozenset({"append_prompt", "rewrite_seed_prompts", "reset_to_seed_prompts", "restart_generation"})


def check_message(kind: str, data: dict[str, Any], project: Project) -> dict[str, Any]:
    """Check one client message of type `kind` against the project's state.

    Returns:
        the request: `{"type": kind, ...}` with its cleaned fields (append_prompt: prompt, prompt_id,
        truncated; rewrite_seed_prompts: instruction (None: none), window; toggles and
        set_generation_paused: enabled; project_init_v1: init, a `ProjectInit`).

    Raises:
        Refused: `bad_prompt` (an unusable prompt, named), `bad_message` (a wrong field, named),
            `no_project`, `segment_cap_reached`, `nothing_to_rewrite`, `already_initialized`, `unsupported`,
            `unknown_type`.
    """
    try:
        return _check(kind, data, project)
    except PromptError as e:
        raise Refused("bad_prompt", f"{kind}: {e}") from None


def _check(kind: str, data: dict[str, Any], p: Project) -> dict[str, Any]:
    if kind in NEEDS_PROJECT and not p.active:
        raise Refused("no_project", f"{kind}: no project is active; send project_init_v1 first")
    if kind == "append_prompt":
        prompt, truncated = clean_prompt(data.get("prompt"))
        if p.at_cap:
            raise Refused("segment_cap_reached", f"this rollout has played its {p.cap} segments; send "
                          "rewrite_seed_prompts or restart_generation to start another")
        pid = data.get("prompt_id")
        pid = pid[:128] if isinstance(pid, str) and pid else f"wc-{time.monotonic_ns()}"
        return {"type": kind, "prompt": prompt, "prompt_id": pid, "truncated": truncated}
    if kind == "rewrite_seed_prompts":
        instruction = data.get("rewrite_instruction")
        if instruction is not None and not isinstance(instruction, str):
            raise Refused("bad_message", f"{kind}: rewrite_instruction must be a string, got "
                          f"{type(instruction).__name__}")
        instruction = clean_prompt(instruction)[0] if instruction and instruction.strip() else None
        raw = data.get("prompt_window_prompts")
        window = clean_window(raw, "prompt_window_prompts") if raw is not None else []
        if instruction is None and not window and not p.seeds:
            raise Refused("nothing_to_rewrite", f"{kind}: no rewrite_instruction, no prompt_window_prompts and "
                          "no seed prompts to rewrite")
        return {"type": kind, "instruction": instruction, "window": window}
    if kind in TOGGLES or kind == "set_generation_paused":
        key = "paused" if kind == "set_generation_paused" else "enabled"
        if not isinstance(data.get(key), bool):
            raise Refused("bad_message", f"{kind} requires a boolean {key!r}")
        return {"type": kind, "enabled": data[key]}
    if kind == "project_init_v1":
        return {"type": kind, "init": ProjectInit.parse(data)}
    if kind in ("reset_to_seed_prompts", "restart_generation", "end_project_keep_session", "set_rewrite_model",
                "leave"):
        return {"type": kind}
    if kind == "session_init_v2":
        raise Refused("already_initialized", "session_init_v2 was already received on this socket; send "
                      "end_project_keep_session, then project_init_v1, for a new project")
    if kind in UNSUPPORTED:
        raise Refused("unsupported", f"worldcast does not serve Dreamverse's {kind!r} (it needs a language model "
                      f"or Dreamverse's simple mode); it serves {', '.join(SUPPORTED)}")
    raise Refused("unknown_type", f"unknown message type {kind[:64]!r}")
