"""No import circles among the project's own modules (``clawhub.*``, ``workers.*``).

Every import statement counts, those inside functions too: a lazy import only hides a circle from start-up,
and it still means the two modules cannot be understood (or moved) one without the other. Imports under
``if TYPE_CHECKING:`` never run and are left out. ``from package import name`` points at the submodule when
``name`` is one, else at the package itself; importing ``a.b.c`` is an edge to ``a.b.c`` only (a package's
``__init__`` that imports its own submodules is not a circle).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("clawhub", "workers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        edges: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in files:
                        target = target.rpartition(".")[0]
                    if target:
                        edges.add(target)
                continue
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if f"{base}.{alias.name}" in files:
                    edges.add(f"{base}.{alias.name}")
                elif base in files:
                    edges.add(base)
        edges.discard(module)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan), as a path that ends where it
    began."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:  # walk inside the group until a module repeats: that stretch is a circle
            nxt = min(w for w in graph[path[-1]] if w in group)
            if nxt in seen:
                cycles.append(path[path.index(nxt):] + [nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return cycles


def test_the_finder_sees_a_lazy_circle(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    source = "def f():\n    from clawhub.x import y\nif TYPE_CHECKING:\n    import clawhub.z\n"
    found = [ast.unparse(n) for n in _runtime_imports(ast.parse(source))]
    assert found == ["from clawhub.x import y"]


def test_no_import_cycles_among_project_modules():
    graph = import_graph()
    assert "clawhub.conversations.hooks" in graph and len(graph) > 100
    cycles = import_cycles(graph)
    assert cycles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)
