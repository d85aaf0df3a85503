"""The import graph of the whole tree (pipeline/, models/, beam_jobs/ and bench/) has no circle.

Read from the source with `ast`, nothing imported: every `import` counts, at module level, in a
function or under `if TYPE_CHECKING:` (a circle that only type checkers follow still ties the
two modules' designs together). `from package import name` points at package.name when that is
a module of the tree, else at the package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ("pipeline", "models", "beam_jobs", "bench")


def modules(root: Path, tops=TREE) -> dict[str, Path]:
    """{dotted name: file} of every module below the `tops` folders of `root`."""
    found = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool, known: dict) -> list[str]:
    """The tree's modules one import statement names."""
    def nearest(name: str) -> str | None:  # the longest prefix that is a module of the tree
        parts = name.split(".")
        while parts:
            if ".".join(parts) in known:
                return ".".join(parts)
            parts.pop()
        return None

    if isinstance(node, ast.Import):
        return [m for m in (nearest(alias.name) for alias in node.names) if m]
    if node.level:  # relative: from the module's package, up level - 1 more
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = package[:len(package) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    targets = []
    for alias in node.names:
        if f"{source}.{alias.name}" in known:
            targets.append(f"{source}.{alias.name}")
        elif nearest(source):
            targets.append(nearest(source))
    return targets


def import_graph(root: Path, tops=TREE) -> dict[str, set[str]]:
    """{module: the tree's modules it imports} (itself left out)."""
    known = modules(root, tops)
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(node, name, path.name == "__init__.py", known))
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(start: str) -> None:  # iterative: the graph is deep enough for recursion limits
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def test_the_whole_tree_has_no_import_circle():
    graph = import_graph(ROOT)
    assert len(graph) > 100 and any(m.startswith("bench.") for m in graph)
    assert "bench.fault_checks" in graph["bench.fault_suite"]  # the reader sees bench's imports
    assert circles(graph) == [], "import circles (every import counts, in functions too)"


def _write(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_finds_a_circle_through_type_checking_and_function_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": ("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from pkg.b import B\n"),
        "pkg/b.py": "def f():\n    from pkg import c\n",
        "pkg/c.py": "from . import a\nimport os\n",
        "pkg/d.py": "import pkg.a\n",  # into the circle, not part of it
        "pkg/sub/__init__.py": "from .. import d\n",
        "pkg/sub/e.py": "from ..sub import f\n",
        "pkg/sub/f.py": "import pkg.sub.e\n",
    })
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.sub"] == {"pkg.d"} and graph["pkg.sub.e"] == {"pkg.sub.f"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.sub.e", "pkg.sub.f"]]
    (tmp_path / "pkg" / "a.py").write_text("import os\n")
    (tmp_path / "pkg" / "sub" / "f.py").write_text("")
    assert circles(import_graph(tmp_path, ("pkg",))) == []
