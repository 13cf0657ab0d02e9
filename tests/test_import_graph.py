"""gen/ has no import cycles: every import counts, module-level or inside a function, relative or absolute.

A cycle hidden behind a function-local import still ties the modules together (neither can be read, tested or moved
without the other), so the graph is built from every import statement in the source.
"""
from __future__ import annotations

import ast
from pathlib import Path

GEN = Path(__file__).resolve().parent.parent / "gen"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name `from <node.module> import ...` refers to, as written in `module`."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, me: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `path` (module `me`) imports anywhere in its text (`from pkg import sub` counts
    as importing pkg.sub)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = resolve(me, path.name == "__init__.py", node)
            for a in node.names:
                found.add(f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source)
    return {m for m in found if m in modules and m != me}


def import_graph(root: Path = GEN) -> dict[str, set[str]]:
    """module -> the modules of the package at `root` it imports."""
    names = {p: module_name(p, root) for p in sorted(root.rglob("*.py"))}
    modules = set(names.values())
    return {name: imports_of(p, name, modules) for p, name in names.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, iterative)."""
    state: dict[str, str] = {}
    for root in sorted(graph):
        if root in state:
            continue
        stack, path = [(root, iter(sorted(graph[root])))], [root]
        state[root] = "open"
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = "done"
                stack.pop()
                path.pop()
            elif state.get(child) == "open":
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = "open"
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_the_graph_sees_relative_absolute_and_function_local_imports(tmp_path):
    pkg = tmp_path / "gen"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("import gen.a\nfrom .. import d\n")
    (pkg / "d.py").write_text("")
    graph = import_graph(pkg)
    assert graph == {"gen": set(), "gen.a": {"gen.b"}, "gen.b": {"gen.sub.c"}, "gen.sub": set(),
                     "gen.sub.c": {"gen.a", "gen.d"}, "gen.d": set()}
    assert find_cycle(graph) == ["gen.a", "gen.b", "gen.sub.c", "gen.a"]


def test_gen_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in gen/: " + " -> ".join(cycle)
