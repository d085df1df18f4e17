"""The family's factory as a user meets it: published file names pick the preset, EMA weights as the
reference runs them, LongLive's LoRA found beside its base and merged, Wan 2.1's own release folder
(Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/) as the base; refusals name the fix."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from tests.models.causal_wan.refs import randomize_
from worldcast.models.causal_wan.config import tiny
from worldcast.models.causal_wan.dit import CausalWanDiT
from worldcast.models.causal_wan.factory import load
from worldcast.models.causal_wan.keys import _T5_BLOCK, WeightsError
from worldcast.models.causal_wan.presets import PresetError
from worldcast.models.causal_wan.text import TextEncoder

CFG = tiny()
FIXTURES = Path(__file__).parent / "fixtures"


def wan_release_folder(root: Path) -> Path:
    """A Wan 2.1 release folder at tiny sizes: its own VAE and umT5 file names and layouts."""
    root.mkdir(parents=True, exist_ok=True)
    vae = {k.removeprefix("weights."): v.float() for k, v in load_file(str(FIXTURES / "wan_vae.safetensors")).items()
           if k.startswith("weights.")}  # Wan's VAE names, the tiny config's sizes (base 4, z 4)
    torch.save(vae, root / "Wan2.1_VAE.pth")
    text = TextEncoder.tiny_random(dim=CFG.text_dim, text_len=CFG.text_len, seed=5)
    back = {v: k for k, v in _T5_BLOCK.items()}
    wan_t5 = {"token_embedding.weight": text.model.state_dict()["shared.weight"],
              "norm.weight": text.model.state_dict()["encoder.final_layer_norm.weight"]}
    for k, v in text.model.state_dict().items():
        if k.startswith("encoder.block."):
            i, rest = k.split(".")[2], ".".join(k.split(".")[3:])
            wan_t5[f"blocks.{i}.{back[rest]}"] = v
    torch.save(wan_t5, root / "models_t5_umt5-xxl-enc-bf16.pth")
    text.tokenizer.save_pretrained(root / "google" / "umt5-xxl")  # type: ignore[attr-defined]
    (root / "config.json").write_text(json.dumps({"_class_name": "WanModel", "num_heads": CFG.heads}))
    return root


def generator_state(seed: int) -> dict[str, torch.Tensor]:
    dit = CausalWanDiT(CFG)
    randomize_(dit, seed=seed)
    return {f"model.{k}": v for k, v in dit.state_dict().items()}


def request(weights: Path, **options: object) -> SimpleNamespace:
    return SimpleNamespace(variant="checkpoint", weights=weights, device="cpu", options=options)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wan_release_folder(tmp_path_factory.mktemp("wan") / "Wan2.1-T2V-1.3B")


def test_self_forcing_file_serves_its_ema_weights_with_its_preset(base: Path, tmp_path: Path) -> None:
    gen, ema = generator_state(1), generator_state(2)
    pt = tmp_path / "checkpoints" / "self_forcing_dmd.pt"
    pt.parent.mkdir()
    torch.save({"generator": gen, "generator_ema": ema}, pt)
    m = load(request(pt, wan_base=base))
    assert m.spec.name == "causal-wan:self-forcing" and (m.cfg.local_attn_size, m.cfg.sink_size) == (21, 0)
    w = m.dit.state_dict()["blocks.0.self_attn.q.weight"]
    assert torch.equal(w, ema["model.blocks.0.self_attn.q.weight"]), "Self-Forcing's README runs --use_ema"
    assert "generator_ema" in m.source and "wan folder" in m.source
    plain = load(request(pt, wan_base=base, no_ema=True))
    assert torch.equal(plain.dit.state_dict()["blocks.0.self_attn.q.weight"], gen["model.blocks.0.self_attn.q.weight"])
    # the whole chain runs: umT5 from Wan's file, its tokenizer folder, the VAE from Wan's file
    assert m.encode_prompt("a red fox").shape == (512, CFG.text_dim)  # Wan's text_len
    frames, _ = m.vae.decode_chunk(torch.randn(1, 4, 3, 8, 8), None, first_chunk=True)
    assert frames.shape == (1, 9, 64, 64, 3)
    with pytest.raises(ValueError, match="contradict"):
        load(request(pt, wan_base=base, ema=True, no_ema=True))


def test_causvid_file_has_no_ema_and_its_own_schedule(base: Path, tmp_path: Path) -> None:
    pt = tmp_path / "autoregressive_checkpoint" / "model.pt"
    pt.parent.mkdir()
    torch.save({"generator": generator_state(3)}, pt)
    m = load(request(pt, wan_base=base))
    assert m.spec.name == "causal-wan:causvid" and m.cfg.timesteps == (1000.0, 757.0, 522.0)
    assert m.spec.timesteps == m.cfg.flow_times and m.spec.timesteps[1] != 0.757
    with pytest.raises(WeightsError, match="no EMA weights"):
        load(request(pt, wan_base=base, ema=True))


def test_longlive_base_merges_the_lora_beside_it(base: Path, tmp_path: Path) -> None:
    gen = generator_state(4)
    models = tmp_path / "longlive_models" / "models"
    models.mkdir(parents=True)
    torch.save({"generator": gen}, models / "longlive_base.pt")
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(4, CFG.dim, generator=g), torch.randn(CFG.dim, 4, generator=g)
    torch.save({"generator_lora": {"base_model.model.blocks.1.cross_attn.k.lora_A.weight": a,
                                   "base_model.model.blocks.1.cross_attn.k.lora_B.weight": b}}, models / "lora.pt")
    m = load(request(models / "longlive_base.pt", wan_base=base))
    assert m.spec.name == "causal-wan:longlive" and (m.cfg.local_attn_size, m.cfg.sink_size) == (12, 3)
    want = gen["model.blocks.1.cross_attn.k.weight"] + b @ a  # alpha = rank: scale 1
    torch.testing.assert_close(m.dit.state_dict()["blocks.1.cross_attn.k.weight"], want)
    assert "LoRA" in m.source
    half = load(request(models / "longlive_base.pt", wan_base=base, lora_alpha=2.0))  # alpha / r = 0.5
    torch.testing.assert_close(half.dit.state_dict()["blocks.1.cross_attn.k.weight"],
                               gen["model.blocks.1.cross_attn.k.weight"] + 0.5 * b @ a)
    torch.save({"generator_lora": {"base_model.model.blocks.9.ffn.0.lora_A.weight": a,
                                   "base_model.model.blocks.9.ffn.0.lora_B.weight": b}}, tmp_path / "bad.pt")
    with pytest.raises(WeightsError, match="blocks.9.ffn.0.weight"):
        load(request(models / "longlive_base.pt", wan_base=base, lora=tmp_path / "bad.pt"))


def test_refusals_say_what_to_do(base: Path, tmp_path: Path) -> None:
    pt = tmp_path / "my_model.pt"
    torch.save({"generator": generator_state(7)}, pt)
    with pytest.raises(PresetError, match="--wan-preset"):
        load(request(pt, wan_base=base))
    assert load(request(pt, wan_base=base, wan_preset="causvid")).spec.name == "causal-wan:causvid"
    with pytest.raises(WeightsError, match="--wan-base"):
        load(request(pt, wan_preset="causvid"))
    with pytest.raises(WeightsError, match="neither a diffusers folder"):
        load(request(pt, wan_preset="causvid", wan_base=tmp_path))
    with pytest.raises(ValueError, match="--weights"):
        load(SimpleNamespace(variant="checkpoint", weights=None, device="cpu", options={}))
