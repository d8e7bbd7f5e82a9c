"""Every package under treeflash/ imports one way (DESIGN.md): cli -> {server, train, bench} -> data ->
engine -> spec -> models -> kv -> kernels. A module imports only from its own package or a lower
layer; packages of one layer (server, train, bench) do not import each other. Lazy imports inside
functions and TYPE_CHECKING imports count too. And no two modules import each other, directly or
through others (an import cycle)."""

import ast
from pathlib import Path

import treeflash

PACKAGE = Path(treeflash.__file__).parent
LAYERS = (("kernels",), ("kv",), ("models",), ("spec",), ("engine",), ("data",), ("server", "train", "bench"), ("cli",))  # lowest first
SHARED = {"errors", ""}  # treeflash.errors and the package itself: importable from every layer


def imported_names(path: Path) -> set[str]:
    """Every treeflash module or name this file imports (`from a.b import c` gives a.b and a.b.c)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n == "treeflash" or n.startswith("treeflash.")}


def imported_layers(path: Path) -> set[str]:
    """The top-level treeflash modules and packages this file imports ("" for the package's own names)."""
    top = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    layers = set()
    for n in imported_names(path):
        part = (n.split(".") + [""])[1]
        layers.add(part if part in top else "")
    return layers


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    assert packages == {name for layer in LAYERS for name in layer}, packages


def test_packages_import_downward_only():
    bad = []
    for rank, layer in enumerate(LAYERS):
        below = {name for lower in LAYERS[:rank] for name in lower}
        for package in layer:
            allowed = below | {package} | SHARED
            for path in sorted((PACKAGE / package).rglob("*.py")):
                bad += [f"{path.relative_to(PACKAGE)} imports treeflash.{up}" for up in imported_layers(path) - allowed]
    assert not bad, "\n".join(bad)


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges = {m: {n for n in imported_names(p) if n in paths and n != m and n != "treeflash"} for m, p in paths.items()}
    assert not import_cycles(edges), import_cycles(edges)


def test_the_cycle_check_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
