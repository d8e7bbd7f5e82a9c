"""The built wheel, installed into a fresh venv that sees only its declared runtime dependencies
(tests/deploy/wheel.py), imports every module and runs the CLI: --help of every command, and a
real greedy generation on the CPU (through the Triton-importing decode loop), token-identical to
the same command run from the source tree."""

import os
import subprocess
import sys
import zipfile

import pytest

from tests.deploy.wheel import fresh_venv, install_wheel, link_distributions, runtime_closure, wheel_requirements
from tests.models.test_loaders import random_hf, write_gguf
from treeflash.cli.main import main

pytestmark = pytest.mark.deploy
TEST_ONLY = {"pytest", "pytest-xdist", "openai", "accelerate"}  # in the test extra and not needed at run time
IMPORT_ALL = """
import importlib, pkgutil, treeflash
names = [m.name for m in pkgutil.walk_packages(treeflash.__path__, "treeflash.")]
for name in names:
    importlib.import_module(name)
print(len(names), treeflash.__file__)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel):
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    site = fresh_venv(venv)
    closure = runtime_closure(wheel_requirements(wheel))
    link_distributions(closure, site)
    install_wheel(wheel, venv)
    return wheel, venv, closure


def run_in(venv, *cmd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=venv, timeout=timeout)


def test_wheel_carries_the_package_and_its_assets(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "treeflash/cli/main.py" in names and "treeflash/models/hub.py" in names
    assert any(n.startswith("treeflash/assets/smollm2_dflash/") for n in names)  # the shipped drafter
    assert not [n for n in names if n.startswith("tests/")]


def test_runtime_closure_is_declared_without_the_test_extra(installed):
    _, venv, closure = installed
    assert {"torch", "transformers", "fastapi", "uvicorn", "httpx", "huggingface-hub"} <= set(closure)
    if sys.platform == "linux":
        assert "triton" in closure  # the CPU torch wheel does not bring it: the marker must
    assert not TEST_ONLY & set(closure)
    # every requirement of everything visible in the fresh venv is satisfied there
    check = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "check"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    absent = run_in(venv, "python", "-c", "import importlib.util as u; print([m for m in ('pytest', 'openai', 'accelerate') if u.find_spec(m)])")
    assert absent.stdout.strip() == "[]", absent.stderr


def test_every_module_imports_and_every_command_has_help(installed):
    _, venv, _ = installed
    r = run_in(venv, "python", "-c", IMPORT_ALL)
    assert r.returncode == 0, r.stderr
    assert str(venv) in r.stdout  # the installed copy, not the source tree
    for command in ([], ["generate"], ["serve"], ["bench"], ["train-drafter"]):
        r = run_in(venv, "treeflash", *command, "--help")
        assert r.returncode == 0 and "examples:" in r.stdout, (command, r.stderr)


def test_installed_cli_generates_like_the_source_tree(installed, tmp_path, capsys):
    _, venv, _ = installed
    model = write_gguf(tmp_path / "tiny.gguf", random_hf("llama"))
    args = ["generate", "--model", str(model), "--prompt", "!#%", "--max-tokens", "6", "--ignore-eos", "--quiet", "--threads", "1"]
    r = run_in(venv, "treeflash", *args)
    assert r.returncode == 0, r.stderr
    capsys.readouterr()
    assert main(args) == 0  # the source tree's CLI, in this process
    assert r.stdout.strip() and r.stdout == capsys.readouterr().out
