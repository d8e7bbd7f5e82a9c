"""The core layers of DESIGN.md import one way: engine -> spec -> models -> kv -> kernels. A module
imports only from its own layer or below (lazy imports inside functions count too)."""

import ast
from pathlib import Path

import treeflash

PACKAGE = Path(treeflash.__file__).parent
ORDER = ("kernels", "kv", "models", "spec", "engine")  # lowest first
SHARED = {"errors", ""}  # treeflash.errors and the package itself: importable from every layer


def imported_layers(path: Path) -> set[str]:
    layers = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "treeflash":
                layers.add(parts[1] if len(parts) > 1 else "")
    return layers


def test_core_layers_import_downward_only():
    bad = []
    for rank, layer in enumerate(ORDER):
        allowed = set(ORDER[: rank + 1]) | SHARED
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            bad += [f"{path.relative_to(PACKAGE)} imports treeflash.{up}" for up in imported_layers(path) - allowed]
    assert not bad, "\n".join(bad)
