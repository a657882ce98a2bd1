"""No import loop between opforge's top-level packages (and none between the
modules of one package).

The graph is built statically from the source: every ``import`` / ``from ...
import`` that runs when a module is imported (module level, class bodies,
``try`` blocks), not those inside functions or under ``if TYPE_CHECKING:``.
Each module is then collapsed to its top-level package (``runtime``,
``kernels``, ``ops``, ``sql``, ``bench``, ...; a top-level module such as
``cli`` or ``tune`` is its own node). The root ``opforge/__init__.py`` is left
out: it re-exports the public API and every module implicitly imports it first.

``from opforge.a import b`` is an edge to the module ``opforge.a.b`` when there
is one, else to ``opforge.a`` (a name defined in the package's ``__init__``).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "opforge"

# The layers read downwards (runtime <- kernels <- ops <- fusion / nn <- sql / stream / ...): no
# edge is excused, so a new loop fails here with the imports that make it.
ALLOWED_LOOP_EDGES_BEING_CUT: frozenset = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / ROOT).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_time_nodes(body: list[ast.stmt]):
    """The import statements that run when the module body runs."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(node.orelse)
        elif isinstance(node, ast.ClassDef):
            yield from _import_time_nodes(node.body)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            yield from _import_time_nodes(node.body)
            for h in node.handlers:
                yield from _import_time_nodes(h.body)
            yield from _import_time_nodes(node.orelse)
            yield from _import_time_nodes(node.finalbody)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(getattr(node, "orelse", []))


def module_graph(deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the opforge modules it imports at import time (``deferred``: or anywhere, imports
    inside functions included)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))) if deferred \
            else _import_time_nodes(tree.body)
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import opforge.a.b` names a module; keep the longest known prefix
                    t = t.rpartition(".")[0]
                if t and t != mod and t.split(".")[0] == ROOT:
                    graph[mod].add(t)
    return graph


def package_of(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def package_graph(deferred: bool = False) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, deps in module_graph(deferred).items():
        src = package_of(mod)
        graph.setdefault(src, set())
        for d in deps:
            dst = package_of(d)
            if dst != src and ROOT not in (src, dst):
                graph[src].add(dst)
    return dict(graph)


def find_cycles(graph: dict[str, set[str]], allowed=frozenset()) -> list[list[str]]:
    """One concrete loop per strongly connected component (Tarjan), ignoring ``allowed`` edges."""
    g = {a: {b for b in bs if (a, b) not in allowed and b in graph} for a, bs in graph.items()}
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def connect(v):  # iterative Tarjan: the module graph is deep
        work = [(v, iter(sorted(g[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        sccs.append(set(comp))

    for v in sorted(g):
        if v not in index:
            connect(v)
    return [_a_loop(g, comp) for comp in sccs]


def _a_loop(g, comp: set[str]) -> list[str]:
    """A shortest loop through the component's smallest node (breadth-first)."""
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v] & comp):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def _where(a: str, b: str) -> str:
    """The modules that make the edge a -> b (packages or modules)."""
    graph = module_graph()
    if a in graph:
        return f"{a} imports {b}"
    hits = sorted(f"{m} -> {d}" for m, ds in graph.items() for d in ds if package_of(m) == a and package_of(d) == b)
    return f"{a} -> {b}: " + ", ".join(hits[:4]) + (f" (+{len(hits) - 4} more)" if len(hits) > 4 else "")


def _report(cycles: list[list[str]]) -> str:
    lines = []
    for c in cycles:
        lines.append("import loop: " + " -> ".join(c))
        lines += [f"    {_where(a, b)}" for a, b in zip(c, c[1:])]
    return "\n".join(lines) + ("\n(module-level imports only; move one import into the function that uses it, "
                               "or move the shared code down a layer)")


def test_no_import_loop_between_top_level_packages():
    cycles = find_cycles(package_graph(), ALLOWED_LOOP_EDGES_BEING_CUT)
    assert not cycles, _report(cycles)


def test_no_loop_between_top_level_packages_counting_imports_inside_functions():
    """A deferred import still makes a loop of dependencies (the registry importing ops, a kernel
    importing an op's layout helper): the layers must read downwards either way."""
    cycles = find_cycles(package_graph(deferred=True))
    assert not cycles, _report(cycles)


def test_no_import_loop_between_modules():
    cycles = find_cycles(module_graph(), ALLOWED_LOOP_EDGES_BEING_CUT)
    assert not cycles, _report(cycles)


def test_the_checker_sees_a_loop_and_ignores_function_level_and_type_checking_imports(tmp_path):
    pkg = tmp_path / ROOT
    for name, text in {
        "__init__.py": "",
        "a/__init__.py": "", "a/x.py": "from opforge.b import y\n",
        "b/__init__.py": "", "b/y.py": "import opforge.a.x\n",
        "c/__init__.py": "", "c/z.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from opforge.d import w\n",
        "d/__init__.py": "", "d/w.py": "def f():\n    from opforge.c import z\n",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    globals()["SRC"], saved = tmp_path, SRC
    try:
        cycles = find_cycles(package_graph())
        assert cycles == [["a", "b", "a"]], cycles
        assert "a -> b: opforge.a.x -> opforge.b.y" in _report(cycles)
        assert find_cycles(package_graph(), {("b", "a")}) == []
    finally:
        globals()["SRC"] = saved
