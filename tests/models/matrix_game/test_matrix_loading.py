"""Loading the release's DiT files through the key table: the release layout loads, bad keys are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.models.matrix_game.tiny_weights import FIXTURE_CONFIGS, seeded_state
from worldcast.models.causal_wan.loading import WeightsError
from worldcast.models.matrix_game.config import MatrixGameConfig, gta_drive, templerun, tiny, universal
from worldcast.models.matrix_game.loading import (
    VARIANT_FILES,
    expected_release_keys,
    load_dit,
    release_to_ours,
    variant_file,
)

CFG = tiny()


def _release_folder(tmp_path: Path, state: dict[str, torch.Tensor], variant: str = "universal") -> Path:
    folder, name = VARIANT_FILES[variant]
    (tmp_path / folder).mkdir(parents=True)
    save_file({k: v.float().contiguous() for k, v in state.items()}, str(tmp_path / folder / name))
    return tmp_path


def test_matrix_release_layout_loads_every_key_through_the_table(tmp_path: Path) -> None:
    keys = expected_release_keys(CFG)
    assert all(k.startswith("model.") for k in keys)
    state = seeded_state(keys, seed=1, dtype=torch.float32)
    cfg, dit = load_dit(_release_folder(tmp_path, state), "universal", cfg=CFG)
    own = dit.state_dict()
    assert len(own) == len(state)
    for k, v in state.items():
        assert torch.equal(own[release_to_ours(k)], v), k
    assert cfg is CFG and dit.dtype == torch.float32 and not dit.training


@pytest.mark.parametrize(("edit", "match"), [
    ("drop", r"missing keys \['model.blocks.1.action_model.t_qkv.weight'\]"),
    ("extra", r"unexpected keys \['model.blocks.2.action_model.t_qkv.weight'\]"),
    ("text", r"unexpected keys \['model.text_embedding.0.weight'\]"),
    ("shape", r"model.img_emb.proj.1.weight has shape \(1280, 7\)"),
    ("prefix", r"lack the release's 'model.' prefix"),
])
def test_matrix_a_bad_key_is_an_error_naming_it(tmp_path: Path, edit: str, match: str) -> None:
    state = seeded_state(expected_release_keys(CFG), seed=1, dtype=torch.float32)
    if edit == "drop":
        del state["model.blocks.1.action_model.t_qkv.weight"]
    elif edit == "extra":  # block 2 has no action module in this config
        state["model.blocks.2.action_model.t_qkv.weight"] = state["model.blocks.1.action_model.t_qkv.weight"].clone()
    elif edit == "text":
        state["model.text_embedding.0.weight"] = torch.zeros(32, 4096)
    elif edit == "shape":
        state["model.img_emb.proj.1.weight"] = torch.zeros(1280, 7)
    else:
        state["blocks.0.modulation"] = state.pop("model.blocks.0.modulation")
    with pytest.raises(WeightsError, match=match):
        load_dit(_release_folder(tmp_path, state), "universal", cfg=CFG)


def test_matrix_a_config_beside_the_file_must_agree(tmp_path: Path) -> None:
    state = seeded_state(expected_release_keys(CFG), seed=1, dtype=torch.float32)
    root = _release_folder(tmp_path, state)
    release = dict(FIXTURE_CONFIGS["universal"], local_attn_size=9)
    (root / VARIANT_FILES["universal"][0] / "config.json").write_text(json.dumps(release))
    with pytest.raises(WeightsError, match="disagrees with the universal preset on"):
        load_dit(root, "universal", cfg=CFG)


def test_matrix_variant_files_and_presets_are_the_releases(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown Matrix-Game 2.0 variant 'minecraft'"):
        variant_file(tmp_path, "minecraft")
    with pytest.raises(FileNotFoundError, match="gta_keyboard2dim.safetensors"):
        variant_file(tmp_path, "gta-drive")
    u, g, t = universal(), gta_drive(), templerun()
    assert u.action is not None and g.action is not None and t.action is not None
    assert (u.action.keyboard_dim_in, u.action.enable_mouse, u.local_attn_size, u.denoising_steps) == \
        (4, True, 6, (1000, 666, 333))
    assert (g.action.keyboard_dim_in, g.local_attn_size, g.window_frames) == (2, 4, 1)
    assert (t.action.keyboard_dim_in, t.action.enable_mouse, t.denoising_steps) == (7, False, (1000, 750, 500, 250))
    keys = expected_release_keys(u)  # the full-size universal model, on the meta device
    assert keys["model.blocks.14.action_model.t_qkv.weight"] == (3072, 1024)
    assert keys["model.blocks.14.action_model.mouse_mlp.0.weight"] == (1024, 2 * 12 + 1536)
    assert keys["model.blocks.0.action_model.keyboard_attn_kv.weight"] == (2048, 128 * 12)
    assert keys["model.patch_embedding.weight"] == (1536, 36, 1, 2, 2)
    assert not any(k.startswith("model.blocks.15.action_model") for k in keys)


def test_matrix_release_config_json_reads_into_the_config() -> None:
    cfg = MatrixGameConfig.from_release(FIXTURE_CONFIGS["keyboard_only"], {"denoising_step_list": [1000, 500],
                                                                          "num_frame_per_block": 3})
    assert cfg.action is not None and cfg.action.blocks == (0, 2) and not cfg.action.enable_mouse
    assert (cfg.dim, cfg.layers, cfg.local_attn_size, cfg.denoising_steps) == (32, 3, 4, (1000, 500))
    with pytest.raises(ValueError, match="only the i2v models"):
        MatrixGameConfig.from_release(dict(FIXTURE_CONFIGS["universal"], model_type="t2v"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_matrix_weights_load_in_their_dtype_without_a_float32_round_trip(tmp_path: Path, dtype: torch.dtype) -> None:
    """A float64 file loads into a float64 DiT bit for bit (issue 31: every weight went through float32,
    5.8e-8 relative at worst); under bf16 the time MLPs and modulation stay float32, the rest is bf16."""
    state = seeded_state(expected_release_keys(CFG), seed=3, dtype=torch.float64)
    state = {k: v * (1 + 2**-40) for k, v in state.items()}  # below float32's resolution: lost through it
    assert any(not torch.equal(v.float().double(), v) for v in state.values())  # the control: float32 loses it
    folder, name = VARIANT_FILES["universal"]
    (tmp_path / folder).mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / folder / name))
    _, dit = load_dit(tmp_path, "universal", cfg=CFG, dtype=dtype)
    own = dit.state_dict()
    for k, v in state.items():
        got = own[release_to_ours(k)]
        assert got.dtype in (dtype, torch.float32) and got.device.type == "cpu", (k, got.dtype)
        assert torch.equal(got, v.to(got.dtype)), f"{k}: not the file's value converted once to {got.dtype}"
    if dtype == torch.bfloat16:
        kept = {k for k, v in own.items() if v.dtype == torch.float32}
        assert kept and all(("time" in k or "modulation" in k) for k in kept), kept
