"""Build treeflash's wheel and install it into a fresh virtual environment that sees only the wheel's
declared runtime dependencies: the proof that `pip install treeflash` needs nothing from the test extra.

The environment is created without pip and without system site-packages. Instead of downloading
the dependencies again (slow, and offline machines cannot), the distributions the wheel's metadata
requires, transitively, with their markers evaluated and no extras, are linked in from the
environment running the tests: their top-level files as their RECORD lists them, dist-info
included. Whatever the closure lacks (triton, httpx, openai, pytest, accelerate ...) is simply
absent, so an undeclared import fails there as it would on a user's machine.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "treeflash")


def build_wheel(out: Path) -> Path:
    """The wheel built from a copy of the sources (a build in place would leave build/ and egg-info behind)."""
    src = out / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = out / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = dist.glob("treeflash-*.whl")
    return wheel


def wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        headers = Parser().parsestr(z.read(meta).decode())
    return [Requirement(r) for r in headers.get_all("Requires-Dist") or []]


def runtime_closure(requirements: list[Requirement]) -> dict[str, md.Distribution]:
    """Installed distributions the requirements need, transitively, without extras; a missing one raises."""
    found: dict[str, md.Distribution] = {}
    todo = [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        dist = md.distribution(req.name)  # PackageNotFoundError: declared but not installed here
        if not req.specifier.contains(dist.version, prereleases=True):
            raise AssertionError(f"{req} is declared, {dist.metadata['Name']} {dist.version} is installed")
        found[name] = dist
        for sub in dist.requires or []:
            sub_req = Requirement(sub)
            if sub_req.marker is None or sub_req.marker.evaluate({"extra": ""}):
                todo.append(sub_req)
    return found


def fresh_venv(path: Path) -> Path:
    """A venv without pip or system site-packages; returns its site-packages directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    (site,) = (path / "lib").glob("python3*/site-packages")
    return site


def link_distributions(dists: dict[str, md.Distribution], site: Path) -> list[str]:
    """Symlink each distribution's top-level files into `site`; returns the linked names."""
    linked = []
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops):
            target = site / top
            if not target.exists() and (base / top).exists():
                target.symlink_to(base / top)
                linked.append(top)
    return linked


def install_wheel(wheel: Path, venv: Path) -> None:
    """pip of the test environment installs into the fresh one (--python), the wheel alone."""
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", "-q", str(wheel)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
