"""No import cycle inside pocket/infer or pocket/formats.

An AST walk of every module's imports, module-level and inside functions alike (a deferred
import is still a dependency), `if TYPE_CHECKING:` blocks left out (they never run). `from P
import X` counts as importing P.X where P.X is a module of the package, else P itself (so an
`__init__.py` that imports a module which imports a name from that `__init__` is a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _modules(package_dir: Path, root: Path) -> dict[str, Path]:
    mods = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[tuple[str, str | None]]:
    """(module, name) for every `from module import name`, (module, None) for `import module`;
    TYPE_CHECKING blocks excluded."""
    found: set[tuple[str, str | None]] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            found.update((source, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(package_dir: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the package's modules it imports}."""
    mods = _modules(package_dir, root)
    graph = {}
    for name, path in mods.items():
        edges = set()
        tree = ast.parse(path.read_text(), str(path))
        for source, attr in _imports(tree, name, path.name == "__init__.py"):
            target = f"{source}.{attr}" if attr is not None and f"{source}.{attr}" in mods else source
            if target in mods and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


@pytest.mark.parametrize("package", ["infer", "formats"])
def test_no_import_cycle(package):
    graph = import_graph(ROOT / "pocket" / package)
    assert len(graph) > 3
    assert cycles(graph) == [], "import cycles (each a set of modules that import each other)"


def test_the_walk_sees_cycles(tmp_path):
    """The walk itself: a function-level import closes a cycle, a TYPE_CHECKING one does not,
    and a name taken from a package's __init__ is an import of the __init__."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import f\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import x\n"
                              "from . import a\n")
    (pkg / "c.py").write_text("from pkg import f\nfrom pkg.b import y\n")
    graph = import_graph(pkg, tmp_path)
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg", "pkg.b"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    (pkg / "a.py").write_text("import pkg.c\n")
    assert cycles(import_graph(pkg, tmp_path)) == [["pkg", "pkg.a", "pkg.b", "pkg.c"]]
