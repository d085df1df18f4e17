"""Import layering (every import counted, type-only and function-level ones too): the directing layer sits above
sessions (`Session` never imports it), sessions/ and transport/ have no import cycle, and the engine is layered: its
core and `tuning/` below the process boundary (`process/`), all of it below sessions, the network edge and the
benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the worldcast package


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("worldcast."):
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("worldcast.")}
    return out


def graph(*packages: str) -> dict[str, set[str]]:
    """Every module of `packages`, subpackages' too, by dotted name -> the modules of `packages` it imports."""
    mods = {".".join(("worldcast", pkg, *p.relative_to(ROOT / pkg).with_suffix("").parts)): p
            for pkg in packages for p in (ROOT / pkg).rglob("*.py") if p.stem != "__init__"}
    return {m: {d for d in imports(p) if d in mods and d != m} for m, p in mods.items()}


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `g` (None: none), by depth-first search."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(g[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_session_knows_nothing_of_directing() -> None:
    deps = imports(ROOT / "sessions" / "session.py")
    assert not {d for d in deps if "directing" in d or "projects" in d}, deps


def test_sessions_and_transport_have_no_import_cycle() -> None:
    g = graph("sessions", "transport")
    # the subpackages' modules are in the graph too
    assert {"worldcast.transport.webrtc.peer", "worldcast.transport.http.routes.sessions"} <= set(g)
    assert cycle(g) is None, cycle(g)
    assert cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the check finds one where there is one
    assert not any(d.startswith("worldcast.transport") for m, ds in g.items() if ".sessions." in m for d in ds)


def test_the_engine_is_layered_core_and_tuning_below_the_process_boundary() -> None:
    g = graph("engine")
    # the subpackages' modules are in the graph too
    assert {"worldcast.engine.process.client", "worldcast.engine.tuning.warmup", "worldcast.engine.rollout"} <= set(g)
    assert cycle(g) is None, cycle(g)
    every = {m: imports(ROOT / Path(*m.split(".")[1:]).with_suffix(".py")) for m in g}
    above = ("worldcast.sessions", "worldcast.transport", "worldcast.latency_bench")
    assert not {m: ds for m, ds in every.items() if any(d.startswith(above) for d in ds)}
    # the core (engine/*.py) and tuning/ know nothing of the process boundary; the process builds on them
    process = "worldcast.engine.process"
    assert not {m: ds for m, ds in every.items()
                if not m.startswith(process + ".") and any(d.startswith(process) for d in ds)}
    assert any(d.startswith("worldcast.engine.tuning") for d in g["worldcast.engine.process.launch"])


def test_sessions_never_ask_which_kind_of_engine_they_hold() -> None:
    """One engine contract: nothing in sessions/ tests an engine's kind (`isinstance` with `LocalEngine` or
    `EngineClient`) or reaches past the handle (its `process` flag, a local engine's `worker` or `core`)."""
    kinds, past = {"LocalEngine", "EngineClient"}, {"process", "worker", "core", "mirrors_inputs"}
    found = []
    for path in sorted((ROOT / "sessions").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and any(isinstance(n, ast.Name) and n.id in kinds for n in ast.walk(node.args[1]))):
                found.append(f"{path.name}:{node.lineno} isinstance")
            elif isinstance(node, ast.Attribute) and node.attr in past:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not found, found
    probe = ast.parse("isinstance(e, LocalEngine) and e.process")  # the check sees what it looks for
    assert any(isinstance(n, ast.Attribute) and n.attr == "process" for n in ast.walk(probe))
