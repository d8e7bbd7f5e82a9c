"""House rules a reader can check without running anything (issue #37): no environment switches in the
package, no module constants rebound from outside their module, docs pages that state the present (short),
few result files, and a bench/ index that lists every tool, each run as `python -m bench.NAME`.
(Import direction and cycles: tests/engine/test_layering.py.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "treeflash"
BENCH = ROOT / "bench"

ALLOWED_ENV = {"TREEFLASH_CACHE", "XDG_CACHE_HOME", "TRITON_INTERPRET"}  # documented user settings, Triton's own
MAX_DOC_LINES = 400
MAX_RESULT_FILES = 150
CONSTANT = re.compile(r"[A-Z][A-Z0-9_]+")  # a module constant's name (two characters or more: not an alias like F)


def sources(*roots: Path) -> list[Path]:
    return sorted(p for r in roots for p in r.rglob("*.py"))


def environment_reads(tree: ast.AST) -> list[str]:
    """Keys read through os.environ[...], os.environ.get(...) or os.getenv(...) ("?" for a key that is not a literal)."""
    def key(node) -> str:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "?"

    def is_environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    keys = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            keys.append(key(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            f = node.func
            if (f.attr in ("get", "pop", "setdefault") and is_environ(f.value)) or f.attr == "getenv":
                keys.append(key(node.args[0]))
    return keys


def constant_rebinds(tree: ast.AST) -> list[str]:
    """`module.CONSTANT = ...` (or `module.CONSTANT[...] = ...`, augmented too), `setattr(module, "CONSTANT", ...)`
    and `monkeypatch.setattr(module, "CONSTANT", ...)` / `monkeypatch.setattr("a.b.CONSTANT", ...)`."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for t in targets:
            while isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and CONSTANT.fullmatch(t.attr) and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")):
                found.append(f"line {node.lineno}: .{t.attr} = ...")
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if (isinstance(f, ast.Name) and f.id == "setattr") or (isinstance(f, ast.Attribute) and f.attr == "setattr"):
                args = [a.value for a in node.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                names = [a.rsplit(".", 1)[-1] for a in args]
                if any(CONSTANT.fullmatch(n) for n in names):
                    found.append(f"line {node.lineno}: setattr(..., {names[-1]!r}, ...)")
    return found


def test_no_environment_switches_in_the_package():
    bad = []
    for path in sources(PACKAGE):
        text = path.read_text()
        bad += [f"{path.relative_to(ROOT)}: {name}" for name in set(re.findall(r"TREEFLASH_[A-Z0-9_]+", text)) - ALLOWED_ENV]
        bad += [f"{path.relative_to(ROOT)}: reads ${k}" for k in environment_reads(ast.parse(text)) if k not in ALLOWED_ENV]
    assert not bad, "\n".join(bad)


def test_the_environment_check_finds_a_switch():
    tree = ast.parse("import os\nA = os.environ.get('TREEFLASH_FAST')\nB = os.getenv(name)\nC = os.environ['X']\n")
    assert environment_reads(tree) == ["TREEFLASH_FAST", "?", "X"]


def test_no_module_constant_is_rebound_from_outside():
    """Tunables are fields of frozen config dataclasses passed down, never module constants that a test or
    a tool reassigns (which would steer every caller in the process)."""
    bad = []
    for path in sources(ROOT / "tests", BENCH, PACKAGE):
        bad += [f"{path.relative_to(ROOT)} {hit}" for hit in constant_rebinds(ast.parse(path.read_text()))]
    assert not bad, "\n".join(bad)


def test_the_rebind_check_finds_one():
    tree = ast.parse("qa.BALANCED_SPLITS = 0\nmod.SHAPES['x'] = 1\nmonkeypatch.setattr(dl, 'AUTO_STEPS', 4)\n"
                     "monkeypatch.setattr('a.b.LIMIT', 2)\nself.LIMIT = 1\nmonkeypatch.setattr(m, 'F', 3)\n")
    assert [h.split(":")[0] for h in constant_rebinds(tree)] == ["line 1", "line 2", "line 3", "line 4"]


def test_docs_pages_are_short():
    """docs/*.md state the present; the history lives in docs/journal.md, the one page allowed to grow."""
    pages = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    assert len(pages) > 5
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in pages if p.name != "journal.md"
            and (n := len(p.read_text().splitlines())) > MAX_DOC_LINES]
    assert not long, "\n".join(long)


def test_few_committed_result_files():
    files = [p for d in ("bench/results", "docs/results") if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*") if p.is_file()]
    assert 0 < len(files) < MAX_RESULT_FILES, f"{len(files)} result files: replace superseded ones instead of adding"


def bench_tools() -> list[Path]:
    return sorted(p for p in BENCH.iterdir() if p.suffix in (".py", ".sh") and p.name != "__init__.py")


def test_every_bench_tool_is_in_the_index():
    index = (BENCH / "README.md").read_text()
    tools = bench_tools()
    assert len(tools) > 10
    missing = [p.name for p in tools if f"`{p.stem if p.suffix == '.py' else p.name}`" not in index and f"`{p.name}`" not in index]
    assert not missing, f"bench/README.md has no row or mention for {missing}"


def test_bench_tools_run_as_modules():
    """Tools import the package and each other as `bench.NAME` from the repository root: no sys.path edits,
    no `python bench/NAME.py` in their help or the docs."""
    bad = []
    for p in [t for t in bench_tools() if t.suffix == ".py"]:
        text = p.read_text()
        if re.search(r"sys\.path\.(insert|append)", text):
            bad.append(f"{p.name}: edits sys.path")
        if re.search(r"python3? bench/\w+\.py", text):
            bad.append(f"{p.name}: `python bench/....py` in its text")
    for page in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", BENCH / "README.md"]:
        if page.name != "journal.md" and re.search(r"python3? bench/\w+\.py", page.read_text()):
            bad.append(f"{page.relative_to(ROOT)}: `python bench/....py`")
    assert not bad, "\n".join(bad)
