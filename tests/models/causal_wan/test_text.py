"""The prompt encoder: umT5 output zeroed past each prompt's tokens, text_len rows, no downloads."""

from __future__ import annotations

import torch

from worldcast.models.causal_wan.text import TextEncoder, clean_prompt


def test_padding_rows_are_zero_and_prompt_rows_match_the_encoder() -> None:
    enc = TextEncoder.tiny_random(dim=16, text_len=24, seed=0)
    ctx = enc.encode(["a  red\tcar &amp; rain", "sunset"])
    assert ctx.shape == (2, 24, 16)
    ids = enc.tokenizer(["a red car & rain"], return_tensors="pt")["input_ids"]  # type: ignore[operator]
    n = ids.shape[1]  # 16 bytes + </s>
    assert (ctx[0, n:] == 0).all() and (ctx[0, :n].abs().sum(-1) > 0).all()
    with torch.no_grad():
        alone = enc.model(input_ids=ids).last_hidden_state[0]
    assert torch.allclose(ctx[0, :n], alone, atol=1e-5), "padding must not change the prompt's own rows"
    assert (ctx[1, len("sunset") + 1 :] == 0).all()


def test_long_prompts_are_truncated_to_text_len() -> None:
    enc = TextEncoder.tiny_random(dim=16, text_len=8, seed=0)
    ctx = enc.encode(["x" * 100])
    assert ctx.shape == (1, 8, 16) and (ctx.abs().sum(-1) > 0).all()


def test_cleaning() -> None:
    assert clean_prompt("  a &amp;amp; b\n\nc ") == "a & b c"
