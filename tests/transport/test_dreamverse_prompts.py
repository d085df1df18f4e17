"""Dreamverse's prompts as worldcast takes them: prompt windows and init messages (no server)."""

from __future__ import annotations

import pytest

from worldcast.transport.dreamverse.prompts import ProjectInit, clean_window
from worldcast.transport.errors import PromptError


def test_windows_and_inits_are_checked() -> None:
    assert clean_window(["a", "  ", "b"], "w") == ["a", "b"]
    with pytest.raises(PromptError, match=r"w\[1\]"):
        clean_window(["a", "bad\x00"], "w")
    with pytest.raises(PromptError, match="list"):
        clean_window("a, b", "w")
    init = ProjectInit.parse({"curated_prompts": ["a", 5, " "], "loop_generation_enabled": "yes",
                              "preset_label": "L"})
    assert init.prompts == ["a"] and init.errors and init.loop is False and init.enhancement is True
    custom = ProjectInit.parse({"curated_prompts": [], "initial_rollout_prompt": " a fox "})
    assert custom.initial_prompt == "a fox" and custom.prompts == []
