"""The model registry: names, variants, options, factories; declared variants agree with loaded specs; no module
outside `models/` names a family."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.fake_models import FAMILY as FAKE
from tests.fake_models import register_fake_family
from worldcast.models import registry
from worldcast.models.registry import ModelFamily, ModelOption, ModelVariant

ROOT = Path(__file__).resolve().parents[2]


def test_every_family_resolves_by_name_and_by_variant() -> None:
    names = registry.model_names()
    assert {"tinyworld", "tinyworld:default", "causal-wan", "causal-wan:tiny", "causal-wan:1.3b"} <= set(names)
    fam, var = registry.resolve("causal-wan")
    assert (fam.name, var.name) == ("causal-wan", "1.3b")  # the bare name is the default variant
    assert registry.resolve("causal-wan:tiny")[1].random_weights


@pytest.mark.parametrize("bad, words", [("nope", "unknown model 'nope'"), ("causal-wan:huge", "no variant 'huge'")])
def test_unknown_names_say_what_exists(bad: str, words: str) -> None:
    with pytest.raises(registry.UnknownModel) as e:
        registry.resolve(bad)
    assert words in str(e.value) and "tiny" in str(e.value)


def test_options_are_checked_against_their_family() -> None:
    with pytest.raises(ValueError, match="tinyworld has no option --wan-preset"):
        registry.check_request("tinyworld", weights=None, options={"wan_preset": "tiny"})
    with pytest.raises(ValueError, match="must be one of"):
        registry.check_request("causal-wan:tiny", weights=None, options={"wan_preset": "huge"})
    with pytest.raises(ValueError, match="needs --weights; causal-wan:tiny"):
        registry.check_request("causal-wan", weights=None)
    fam, _ = registry.resolve("causal-wan:tiny")
    assert fam.options_for({})["wan_preset"] == "auto"  # defaults fill what is not given


def test_a_family_declaration_is_checked() -> None:
    v = ModelVariant("a", "a")
    with pytest.raises(ValueError, match="default variant"):
        ModelFamily("x", "x", variants=(v,), default_variant="b", factory="m:f")
    with pytest.raises(ValueError, match="module:function"):
        ModelFamily("x", "x", variants=(v,), default_variant="a", factory="nofunction")
    with pytest.raises(ValueError, match="must be one of"):
        ModelOption("k", "k", choices=("a",)).convert("b")
    register_fake_family()
    other = ModelFamily(FAKE.name, "another", variants=(v,), default_variant="a", factory="m:f")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(other)


@pytest.mark.parametrize("name", ["tinyworld", "tinyworld:3", "causal-wan:tiny", "matrix-game-2:tiny", "fake-palette"])
def test_a_loaded_model_agrees_with_its_declared_variant(name: str) -> None:
    register_fake_family()
    _, var = registry.resolve(name)
    spec = registry.load(name).spec
    assert (spec.frame_height, spec.frame_width, spec.fps) == (var.frame_height, var.frame_width, var.fps)
    assert spec.actions == var.actions
    c, d = spec.conditioning, var.conditioning
    assert (c.text, c.image) == (d.text, d.image)
    assert c.tensors, "the model declares the shapes of its encoded conditioning"
    # what replay checks a log's action vectors against holds every vector the live path makes
    import numpy as np

    model = registry.load(name)
    lo, hi = model.action_bounds()
    space = spec.actions
    assert lo.shape == hi.shape == (space.dim,) and (lo <= hi).all()
    rng = np.random.default_rng(0)
    for _ in range(200):
        keys = {k: bool(rng.random() < 0.4) for k in space.keys}
        axes = {a.name: a.model_value(float(rng.uniform(*a.range)) * (rng.random() < 0.7)) for a in space.axes}
        v = model.encode_action(keys, axes)
        assert ((v >= lo) & (v <= hi)).all(), (keys, axes, v, lo, hi)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_no_module_outside_models_imports_a_model_family() -> None:
    """engine/, sessions/ and transport/ know the contract (spec, base, errors) and the registry, never a family."""
    contract = {"spec", "base", "errors", "registry"}
    families = {p.name for p in (ROOT / "models").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"tinyworld", "causal_wan", "matrix_game"} <= families
    offenders = []
    for folder in ("engine", "sessions", "transport"):
        for path in (ROOT / folder).rglob("*.py"):
            for mod in _imports(path):
                parts = mod.split(".")
                if parts[:2] == ["worldcast", "models"] and len(parts) > 2 and parts[2] not in contract:
                    offenders.append(f"{path.relative_to(ROOT)}: {mod}")
    assert not offenders, offenders


def test_each_family_is_a_folder_and_one_registry_line() -> None:
    for mod in registry.FAMILY_MODULES:
        parts = mod.split(".")
        assert parts[:2] == ["worldcast", "models"] and parts[-1] == "family"
        assert (ROOT / "models" / parts[2] / "family.py").exists()


def test_a_random_variant_refuses_weights_it_would_ignore() -> None:
    with pytest.raises(ValueError, match="random weights and reads no --weights"):
        registry.check_request("causal-wan:tiny", weights=Path("/nonexistent"))
