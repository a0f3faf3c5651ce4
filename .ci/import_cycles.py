"""The import cycles among the project's modules, module-level and function-level imports counted (`if TYPE_CHECKING:`
imports too with --typing): `python import_cycles.py [--typing] [ROOT] [PACKAGE ...]`; exit status 1 if there is one."""
from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module, module: str, is_package: bool, known: set[str]) -> dict[str, str]:
    """The project modules this one imports -> 'module' (at import time), 'function' (inside a def) or 'typing'."""
    found: dict[str, str] = {}

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST, level: str) -> None:
        if isinstance(node, ast.If) and type_checking(node):
            for child in node.body:
                visit(child, "typing")
            for child in node.orelse:
                visit(child, level)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and level == "module":
            level = "function"
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]
        else:
            targets = []
        for target in targets:
            hit = resolve(target)
            if hit and hit != module:
                rank = {"module": 0, "function": 1, "typing": 2}
                if hit not in found or rank[level] < rank[found[hit]]:
                    found[hit] = level
        for child in ast.iter_child_nodes(node):
            visit(child, level)

    for child in tree.body:
        visit(child, "module")
    return found


def graph(root: Path, packages: list[str]) -> dict[str, dict[str, str]]:
    files = {}
    for package in packages:
        path = root / package
        for file in ([path.with_suffix(".py")] if path.with_suffix(".py").is_file() else sorted(path.rglob("*.py"))):
            files[module_name(root, file)] = file
    known = set(files)
    edges = {}
    for module, file in files.items():
        tree = ast.parse(file.read_text(), str(file))
        found = imports(tree, module, file.name == "__init__.py", known)
        # importing a submodule imports its package: `from .recipe import x` inside sweeps.report also counts as
        # sweeps.recipe (resolved above); a package's own __init__ importing its children is an ordinary edge
        edges[module] = {target: level for target, level in found.items()
                         if not module.startswith(target + ".")}  # a module's own parent package: not a cycle
    return edges


def cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def main(argv: list[str]) -> int:
    typing = "--typing" in argv  # count imports under `if TYPE_CHECKING:` too
    argv = [a for a in argv if a != "--typing"]
    root = Path(argv[1] if len(argv) > 1 else ".").resolve()
    packages = argv[2:] or ["fedbench", "sweeps", "cli"]
    edges = graph(root, packages)
    if not typing:
        edges = {m: {t: lv for t, lv in e.items() if lv != "typing"} for m, e in edges.items()}
    found = cycles(edges)
    for component in found:
        print(f"cycle among {len(component)} modules:")
        members = set(component)
        for module in component:
            for target, level in sorted(edges[module].items()):
                if target in members:
                    print(f"  {module} -> {target} ({level}-level)")
    if not found:
        print(f"no import cycle among {', '.join(packages)} ({len(edges)} modules)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
