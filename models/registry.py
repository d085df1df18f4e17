"""The model registry: every world-model family by name, its variants and options, and a factory.

`--model NAME[:VARIANT]`, `GET /v1/models`, the engine's benchmarks and GPU
checks all resolve a model here; nothing outside `models/` names a family.
A family is a folder under `models/` with a `family.py` that declares
`FAMILY = ModelFamily(...)` (plain data, nothing heavy imported) and one
line in `FAMILY_MODULES` below. The factory (`"module:function"`) is
imported only when the model is loaded, as vLLM's `ModelRegistry` resolves
architectures lazily (`vllm/model_executor/models/registry.py`).

    family, variant = resolve("causal-wan:tiny")
    model = load("causal-wan:tiny", device="cpu")
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from worldcast.models.errors import UnknownModel

__all__ = [
    "DEFAULT_MODEL", "FAMILY_MODULES", "LoadRequest", "ModelFamily", "ModelOption", "ModelVariant", "UnknownModel",
    "check_request", "families", "load", "model_names", "option_owner", "register", "resolve",
]
from worldcast.models.spec import ActionSpace, ConditioningSpec

if TYPE_CHECKING:
    from worldcast.models.base import WorldModel

#: The families this installation serves, one module each (each declares `FAMILY`).
FAMILY_MODULES = (
    "worldcast.models.tinyworld.family",
    "worldcast.models.causal_wan.family",
    "worldcast.models.matrix_game.family",
)

#: The model `worldcast serve` runs without `--model`.
DEFAULT_MODEL = "tinyworld"

OptionType = Literal["str", "path", "int", "float", "flag"]


@dataclass(frozen=True)
class ModelOption:
    """A family's own setting, given on the command line as `--NAME` (dashes) and passed to its factory.

    Attributes:
        name: the flag without dashes, e.g. "wan-preset"; the factory reads `options["wan_preset"]`.
        help: one line for `--help`.
        default: used when the flag is not given.
        choices: the allowed values (None: any of `type`).
        type: "str", "path" (a `Path`), "int", "float" or "flag" (a boolean switch, default False).
    """

    name: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: OptionType = "str"

    @property
    def key(self) -> str:
        """The name as a Python identifier: the key in `LoadRequest.options`."""
        return self.name.replace("-", "_")

    def convert(self, value: Any) -> Any:
        """A given value as this option's type.

        Raises:
            ValueError: not of the type, or not one of `choices`.
        """
        if value is None:
            return None
        conv: dict[str, Callable[[Any], Any]] = {"str": str, "path": Path, "int": int, "float": float, "flag": bool}
        out = conv[self.type](value)
        if self.choices is not None and out not in self.choices:
            raise ValueError(f"--{self.name} must be one of {list(self.choices)}, not {value!r}")
        return out


@dataclass(frozen=True)
class ModelVariant:
    """One variant of a family: a size, a checkpoint lineage, or random weights for trying the path.

    The geometry, conditioning and actions are declared here, without loading anything, so
    `GET /v1/models` can list every variant; a loaded model's spec agrees with them
    (`tests/models/test_registry.py`).
    """

    name: str  #: e.g. "tiny", "universal"
    description: str  #: one line
    needs_weights: bool = False  #: `--weights PATH` is required
    random_weights: bool = False  #: streams what random weights make (for trying the path)
    frame_height: int = 0  #: pixels (0: set by an option or the weights)
    frame_width: int = 0  #: pixels
    fps: int = 0  #: pixel frames per second, Hz
    conditioning: ConditioningSpec = field(default_factory=ConditioningSpec)  #: text / image it takes
    actions: ActionSpace | None = None  #: its action space


@dataclass(frozen=True)
class LoadRequest:
    """What a family's factory gets.

    Attributes:
        variant: the variant's name.
        weights: `--weights` (None: the family's default, or random weights for a random variant).
        device: torch device, e.g. "cpu", "cuda:0".
        options: every option of the family by `ModelOption.key`, given or default.
    """

    variant: str
    weights: Path | None
    device: str
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ModelFamily:
    """A registered model family.

    Attributes:
        name: the `--model` name, e.g. "causal-wan".
        description: one line.
        variants: its variants; `default_variant` is used for a bare `--model NAME`.
        options: its own command-line settings.
        factory: "module:function", imported when loading; function(LoadRequest) -> WorldModel.
        checkpoint_check: "module:function" (optional) for the GPU check: function(device, *, smoke, workdir)
            yields (label, WorldModel, info dict) loaded from checkpoints it writes in the family's published
            layouts, so the check covers loading as users do it (`latency_bench/gpu_check/engine.py`; the
            device check's opt-in part `checkpoint_chains`).
    """

    name: str
    description: str
    variants: tuple[ModelVariant, ...]
    default_variant: str
    options: tuple[ModelOption, ...] = ()
    factory: str = ""
    checkpoint_check: str = ""

    def __post_init__(self) -> None:
        names = [v.name for v in self.variants]
        if self.default_variant not in names:
            raise ValueError(f"family {self.name}: default variant {self.default_variant!r} is not one of {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name}: variant names must be unique: {names}")
        if ":" not in self.factory:
            raise ValueError(f"family {self.name}: factory must be 'module:function', not {self.factory!r}")

    def variant(self, name: str | None) -> ModelVariant:
        """The named variant (None: the default).

        Raises:
            UnknownModel: no such variant.
        """
        name = name or self.default_variant
        for v in self.variants:
            if v.name == name:
                return v
        raise UnknownModel(f"model {self.name} has no variant {name!r}; its variants are "
                           f"{[v.name for v in self.variants]}")

    def model_names(self) -> list[str]:
        """Every `--model` spelling: the bare name (default variant) and NAME:VARIANT for each variant."""
        return [self.name] + [f"{self.name}:{v.name}" for v in self.variants]

    def options_for(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The family's options, `given` (by key) over the defaults, converted.

        Raises:
            ValueError: a value of the wrong type or outside its choices; an option of another family.
        """
        own = {o.key: o for o in self.options}
        unknown = [k for k, v in given.items() if k not in own and v is not None]
        if unknown:
            raise ValueError(f"model {self.name} has no option --{unknown[0].replace('_', '-')} "
                             f"(its options: {[f'--{o.name}' for o in self.options] or 'none'})")
        out = {k: o.default for k, o in own.items()}
        for k, v in given.items():
            if v is not None and k in own:
                out[k] = own[k].convert(v)
        return out


_FAMILIES: dict[str, ModelFamily] = {}
_LOADED_BUILTINS = False


def register(family: ModelFamily) -> ModelFamily:
    """Add a family (an installation's own families can register beside the built-in ones).

    Raises:
        ValueError: a different family of that name is registered already.
    """
    old = _FAMILIES.get(family.name)
    if old is not None and old != family:
        raise ValueError(f"a model family named {family.name!r} is registered already")
    _FAMILIES[family.name] = family
    return family


def _builtins() -> None:
    global _LOADED_BUILTINS
    if not _LOADED_BUILTINS:
        for mod in FAMILY_MODULES:
            register(importlib.import_module(mod).FAMILY)
        _LOADED_BUILTINS = True


def families() -> list[ModelFamily]:
    """Every registered family, in registration order."""
    _builtins()
    return list(_FAMILIES.values())


def model_names() -> list[str]:
    """Every accepted `--model` value."""
    return [n for f in families() for n in f.model_names()]


def resolve(model: str) -> tuple[ModelFamily, ModelVariant]:
    """`NAME[:VARIANT]` -> its family and variant.

    Raises:
        UnknownModel: no such family or variant (the message lists what exists).
    """
    _builtins()
    name, _, variant = model.partition(":")
    family = _FAMILIES.get(name)
    if family is None:
        raise UnknownModel(f"unknown model {model!r}; choose one of {model_names()}")
    return family, family.variant(variant or None)


def check_request(model: str, *, weights: Path | None, options: Mapping[str, Any] | None = None) -> None:
    """Check a model choice before anything loads (a server's config does this at start-up).

    Raises:
        UnknownModel: no such family or variant.
        ValueError: the variant needs `--weights` and has none; a bad or foreign option.
    """
    family, variant = resolve(model)
    if variant.random_weights and weights is not None:
        raise ValueError(f"--model {family.name}:{variant.name} has random weights and reads no --weights "
                         f"(given {weights}); pick a variant that loads a checkpoint")
    if variant.needs_weights and weights is None:
        randoms = [f"{family.name}:{v.name}" for v in family.variants if v.random_weights]
        hint = f"; {' or '.join(randoms)} runs without (random weights)" if randoms else ""
        raise ValueError(f"--model {family.name}:{variant.name} needs --weights{hint}")
    family.options_for(options or {})


def load(model: str, *, weights: Path | None = None, device: str = "cpu",
         options: Mapping[str, Any] | None = None) -> WorldModel:
    """Build the named model through its family's factory.

    Args:
        model: "NAME[:VARIANT]".
        weights: the variant's weights (None: its default or random).
        device: torch device.
        options: the family's options by key (missing ones take their defaults).

    Raises:
        UnknownModel, ValueError: as `check_request`.
        FileNotFoundError, ValueError: missing or malformed weights (the factory's message names what).
    """
    check_request(model, weights=weights, options=options)
    family, variant = resolve(model)
    module, _, func = family.factory.partition(":")
    factory = getattr(importlib.import_module(module), func)
    req = LoadRequest(variant=variant.name, weights=weights, device=device,
                      options=MappingProxyType(family.options_for(options or {})))
    return factory(req)


def option_owner(key: str) -> list[ModelFamily]:
    """The families that declare an option with this key."""
    return [f for f in families() if any(o.key == key for o in f.options)]
