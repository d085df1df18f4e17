"""Run a worldcast module from this checkout on a Python that has no worldcast installed (the lent GPU machine).

    python3 latency_bench/gpu_check/launch.py [--wheels DIR] MODULE [ARG...]
    python3 latency_bench/gpu_check/launch.py --wheels .gpu-wheels worldcast.latency_bench.gpu_check --out "$OUT"

The lent machine runs its image's own `python3` with no network: `pip install -e .` cannot fetch the
build backend, and the project's dependencies are not all there. This launcher needs the standard library
alone (it is run as a file, before `worldcast` can be imported):

1. the wheels in `--wheels` (if any) are installed with `pip --no-index --no-deps` into a temporary folder;
2. `worldcast.<sub>` is made importable from the checkout: a temporary folder gets a `worldcast/` folder of
   symbolic links, one per entry of pyproject.toml's `[tool.setuptools.package-dir]` (the one owner of the
   mapping); skipped where `worldcast.engine` already imports from this checkout (an editable install);
3. both folders go in front of `PYTHONPATH`, so the module's own subprocesses see them too, and the
   process is replaced by `python -m MODULE ARG...` (same interpreter).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

#: The checkout this file belongs to.
REPO = Path(__file__).resolve().parents[2]


def package_dirs(repo: Path = REPO) -> dict[str, Path]:
    """pyproject.toml's package-dir mapping: import name (e.g. "worldcast.engine") -> folder in `repo`.

    Raises:
        FileNotFoundError: `repo` has no pyproject.toml.
        KeyError: pyproject.toml has no `[tool.setuptools.package-dir]` table.
    """
    with open(repo / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: repo / folder for name, folder in table.items()}


def link_packages(dest: Path, repo: Path = REPO) -> Path:
    """Make `repo`'s packages importable from `dest`: `dest/worldcast/<sub>` links to each mapped folder.

    Returns `dest` (the folder to put on `sys.path`). Only top-level subpackages of one namespace are
    linked (`worldcast.engine` -> `engine/`); a nested mapping would need its parent linked and is refused.

    Raises:
        ValueError: a mapped name is not `<namespace>.<sub>`, or two namespaces are mapped.
        FileExistsError: a link to be made already exists in `dest`.
    """
    roots = set()
    for name, folder in package_dirs(repo).items():
        parts = name.split(".")
        if len(parts) != 2:
            raise ValueError(f"package-dir entry {name!r} is not <namespace>.<sub>")
        roots.add(parts[0])
        if len(roots) > 1:
            raise ValueError(f"package-dir maps more than one namespace: {sorted(roots)}")
        (dest / parts[0]).mkdir(parents=True, exist_ok=True)
        (dest / parts[0] / parts[1]).symlink_to(folder.resolve(), target_is_directory=True)
    return dest


def imports_from_checkout(repo: Path = REPO) -> bool:
    """Whether `worldcast.engine` already imports from `repo` (an editable install or the path set)."""
    try:
        spec = importlib.util.find_spec("worldcast.engine")
    except ModuleNotFoundError:
        return False
    origin = spec.origin if spec is not None else None
    return origin is not None and Path(origin).resolve().parent == (repo / "engine").resolve()


def install_wheels(wheels: Path, target: Path) -> list[str]:
    """Install every `*.whl` in `wheels` into `target` offline (`pip --no-index --no-deps`); their file names.

    Raises:
        subprocess.CalledProcessError: pip failed (a wheel for another Python or platform, say).
    """
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    if files:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--disable-pip-version-check", "--target", str(target), *files], check=True)
    return [Path(f).name for f in files]


def main(argv: list[str] | None = None) -> int:
    """Set up the path and replace this process with `python -m MODULE ARG...`; returns only on a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    wheels = None
    if args[:1] == ["--wheels"] and len(args) >= 2:
        wheels, args = Path(args[1]), args[2:]
    if not args or args[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    paths = []
    if wheels is not None and wheels.is_dir():
        site = Path(tempfile.mkdtemp(prefix="worldcast-wheels-"))
        if install_wheels(wheels, site):
            paths.append(str(site))
    if not imports_from_checkout():
        paths.append(str(link_packages(Path(tempfile.mkdtemp(prefix="worldcast-path-")))))
    if paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", *args])
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    raise SystemExit(main())
