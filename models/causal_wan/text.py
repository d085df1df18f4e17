"""The prompt encoder: umT5 (transformers' `UMT5EncoderModel`), padded with zeros to text_len tokens.

As Wan / Self-Forcing encode a prompt (Self-Forcing `utils/wan_wrapper.py`
`WanTextEncoder`, diffusers `WanPipeline._get_t5_prompt_embeds`): clean the
text, tokenize to at most text_len tokens with the attention mask, run the
encoder, and set every position past the prompt's own tokens to 0.0. The DiT
still attends to those zero rows (after its text embedding), as Wan does.

Cleaning follows Wan's `whitespace_clean(basic_clean(text))` minus
`ftfy.fix_text` (ftfy is not a dependency; it only repairs mojibake): HTML
entities unescaped twice, whitespace collapsed, stripped.

Two layouts load: a diffusers folder (`text_encoder/`, `tokenizer/`) and Wan
2.1's own files, which Self-Forcing, CausVid and LongLive read
(`models_t5_umt5-xxl-enc-bf16.pth`, Wan's `T5Encoder` names, and the
`google/umt5-xxl/` tokenizer folder; `from_wan_checkpoint`).

`TextEncoder.tiny_random` builds a tiny random umT5 and a byte-level
tokenizer (ByT5's, which needs no files) for the `tiny` config and tests:
it encodes nothing meaningful. Nothing here downloads: real weights come
from a local folder (`from_pretrained`, `local_files_only=True`).
"""

from __future__ import annotations

import html
import logging
import re
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def clean_prompt(text: str) -> str:
    """Wan's prompt cleaning without ftfy: unescape HTML entities (twice), collapse whitespace, strip."""
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def umt5_from_wan_state(raw: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
                        what: str = "Wan umT5") -> torch.nn.Module:
    """transformers' `UMT5EncoderModel` holding Wan's umT5 encoder weights (`wan/modules/t5.py` names).

    The config is read from the tensors' shapes (vocab, width, heads from the relative position bias,
    FFN width, layers); Wan's T5RelativeEmbedding uses max distance 128 and eps 1e-6 (Wan-Video/Wan2.1
    `wan/modules/t5.py`). Built on the meta device; it takes the tensors (converted to `dtype`).

    Raises:
        WeightsError: keys that are not Wan's umT5 encoder (named).
    """
    from transformers import UMT5Config, UMT5EncoderModel

    from worldcast.models.causal_wan.checkpoints import load_state_strict
    from worldcast.models.causal_wan.keys import WeightsError, wan_t5_to_transformers

    try:
        vocab, dim = raw["token_embedding.weight"].shape
        buckets, heads = raw["blocks.0.pos_embedding.embedding.weight"].shape
        d_attn = raw["blocks.0.attn.q.weight"].shape[0]
        d_ff = raw["blocks.0.ffn.fc1.weight"].shape[0]
    except KeyError as e:
        raise WeightsError(f"{what}: not Wan's umT5 encoder (no {e})") from None
    layers = 1 + max(int(k.split(".")[1]) for k in raw if k.startswith("blocks."))
    cfg = UMT5Config(vocab_size=vocab, d_model=dim, d_kv=d_attn // heads, d_ff=d_ff, num_layers=layers,
                     num_heads=heads, relative_attention_num_buckets=buckets, relative_attention_max_distance=128,
                     feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0)
    state = {name: v.to(dtype) for k, v in raw.items() for name in wan_t5_to_transformers(k)}
    state["encoder.embed_tokens.weight"] = state["shared.weight"]  # tied, as transformers keeps them
    with torch.device("meta"):
        model = UMT5EncoderModel(cfg)
    load_state_strict(model, state, what=what, assign=True)
    return model.eval()


class TextEncoder:
    """umT5 encoder + tokenizer; `encode` gives the DiT's context.

    Args:
        model: a transformers `UMT5EncoderModel` (or any encoder returning `last_hidden_state`).
        tokenizer: its tokenizer (called with padding="max_length", truncation=True).
        text_len: tokens per prompt (512 for Wan).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: object, *, text_len: int) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.text_len = text_len

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        """Width of the encoder output (4096 for umT5-XXL)."""
        return int(self.model.config.d_model)  # type: ignore[union-attr]

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, *, text_len: int = 512, dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> TextEncoder:
        """From a diffusers-format root (with `text_encoder/` and `tokenizer/`), local files only.

        Raises:
            FileNotFoundError: either folder is missing.
        """
        from transformers import AutoTokenizer, UMT5EncoderModel

        root = Path(folder)
        for sub in ("text_encoder", "tokenizer"):
            if not (root / sub).is_dir():
                raise FileNotFoundError(f"{root / sub} not found")
        tok = AutoTokenizer.from_pretrained(str(root / "tokenizer"), local_files_only=True)
        model = UMT5EncoderModel.from_pretrained(str(root / "text_encoder"), local_files_only=True, dtype=dtype)
        return cls(model.to(device), tok, text_len=text_len)

    @classmethod
    def from_wan_checkpoint(
        cls, checkpoint: str | Path, tokenizer: str | Path, *, text_len: int = 512, dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> TextEncoder:
        """From Wan's own umT5 file (`models_t5_umt5-xxl-enc-bf16.pth`) and its tokenizer folder.

        See `umt5_from_wan_state`; the model is built on the meta device and takes the file's tensors
        (converted to `dtype`), so the 5.7 B-parameter encoder never exists twice.

        Raises:
            FileNotFoundError: a missing file or folder. WeightsError: keys that are not Wan's umT5 encoder.
        """
        from transformers import AutoTokenizer

        from worldcast.models.causal_wan.checkpoints import read_pt

        ckpt_path, tok_path = Path(checkpoint), Path(tokenizer)
        if not ckpt_path.is_file():
            raise FileNotFoundError(ckpt_path)
        if not tok_path.is_dir():
            raise FileNotFoundError(f"{tok_path} (the umT5 tokenizer folder) not found")
        model = umt5_from_wan_state(read_pt(ckpt_path), dtype=dtype, what=str(ckpt_path))
        tok = AutoTokenizer.from_pretrained(str(tok_path), local_files_only=True)
        return cls(model.to(device), tok, text_len=text_len)

    @classmethod
    def tiny_random(cls, *, dim: int, text_len: int, seed: int = 0) -> TextEncoder:
        """TINY RANDOM umT5 (2 layers of width `dim`) with ByT5's byte tokenizer: for tests and `tiny` only."""
        from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

        tok = ByT5Tokenizer()
        heads = 2 if dim % 2 == 0 else 1
        cfg = UMT5Config(
            vocab_size=len(tok), d_model=dim, d_kv=dim // heads, d_ff=2 * dim, num_layers=2, num_heads=heads,
            relative_attention_num_buckets=8, relative_attention_max_distance=32, dropout_rate=0.0,
        )  # fmt: skip
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = UMT5EncoderModel(cfg)
        return cls(model, tok, text_len=text_len)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> torch.Tensor:
        """Prompts -> context (B, text_len, dim) in the encoder's dtype; rows past each prompt's tokens are 0.

        Raises:
            ValueError: an empty prompt list.
        """
        if not prompts:
            raise ValueError("no prompts")
        batch = self.tokenizer(  # type: ignore[operator]
            [clean_prompt(p) for p in prompts], padding="max_length", max_length=self.text_len, truncation=True,
            add_special_tokens=True, return_attention_mask=True, return_tensors="pt",
        )  # fmt: skip
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        out = self.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, text_len, dim)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("TextEncoder: %d prompts, token counts %s", len(prompts), mask.sum(1).tolist())
        return out * mask[:, :, None].to(out.dtype)
