"""The project's imports checked against its layers: no import cycle, and no import from a lower layer up to a higher
one (`LAYERS`), every import counted, at module level, inside a function and under `if TYPE_CHECKING:` (a type-only
import is a dependency of the code's meaning all the same). `python .ci/import_cycles.py [ROOT]`; prints each cycle
and each upward import, and exits with status 1 if there is one (or a module in no layer)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("fedbench", "sweeps", "cli")
ALIASES = {"fedbench_sweeps": "sweeps"}  # installed names (pyproject.toml's package-dir) -> the checkout's

# Bottom first, as docs/design.md draws them: a layer may import the layers below it, never one above. A name covers
# its module and its submodules; a module is in the layer of the longest name that covers it (so a new fedbench module
# is in the engine's API layer until it is listed lower).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("fedbench.rng", "fedbench.hparams", "fedbench.contract", "fedbench.metrics", "fedbench.oracle",
                     "fedbench.prox", "fedbench.reference", "fedbench.memory", "fedbench.schedules",
                     "fedbench.sources")),
    ("models and data", ("fedbench.networks", "fedbench.data")),
    ("problems and algorithms", ("fedbench.problems", "fedbench.algorithms")),
    ("round transforms", ("fedbench.axes",)),
    ("federation", ("fedbench.engine.federation",)),
    ("build-time rules", ("fedbench.engine.checks", "fedbench.engine.dry_round")),
    ("run record", ("fedbench.engine.record",)),
    ("engine", ("fedbench.engine",)),
    ("engine API", ("fedbench", "fedbench.plugins")),
    ("recipes", ("sweeps.recipe",)),
    ("orchestration", ("sweeps",)),
    ("command line", ("cli",)),
)
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}
LEVELS = ("module", "function", "typing")  # where an import is: at import time, inside a def, under TYPE_CHECKING


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
    """The project modules this one imports -> where it first does (`LEVELS`: module before function before typing)."""
    found: dict[str, str] = {}

    def resolve(name: str) -> str | None:
        top, _, rest = name.partition(".")
        if top in ALIASES:
            name = ALIASES[top] + ("." + rest if rest else "")
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
            if hit and hit != module and (hit not in found or LEVELS.index(level) < LEVELS.index(found[hit])):
                found[hit] = level
        for child in ast.iter_child_nodes(node):
            visit(child, level)

    for child in tree.body:
        visit(child, "module")
    return found


def graph(root: Path, packages: tuple[str, ...]) -> dict[str, dict[str, str]]:
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
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
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


def layer(module: str) -> int | None:
    """The rank of the module's layer in LAYERS (None: in none)."""
    name = module
    while name and name not in RANK:
        name = name.rpartition(".")[0]
    return RANK.get(name)


def placed(module: str) -> str:
    """The module with its layer's name."""
    rank = layer(module)
    return f"{module} ({'no layer' if rank is None else LAYERS[rank][0]})"


def upward(edges: dict[str, dict[str, str]]) -> list[tuple[str, str, str]]:
    """(module, imported, level) of each import from a lower layer up to a higher one."""
    return [(module, target, level) for module, targets in sorted(edges.items())
            for target, level in sorted(targets.items())
            if (here := layer(module)) is not None and (there := layer(target)) is not None and there > here]


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else ".").resolve()
    edges = graph(root, PACKAGES)
    unplaced = sorted(module for module in edges if layer(module) is None)
    found, up = cycles(edges), upward(edges)
    for component in found:
        print(f"cycle among {len(component)} modules:")
        members = set(component)
        for module in component:
            for target, level in sorted(edges[module].items()):
                if target in members:
                    print(f"  {module} -> {target} ({level}-level)")
    for module, target, level in up:
        print(f"upward import: {placed(module)} -> {placed(target)}, {level}-level")
    for module in unplaced:
        print(f"{module} is in no layer: list it in .ci/import_cycles.py's LAYERS")
    if found or up or unplaced:
        return 1
    print(f"no import cycle and no upward import among {', '.join(PACKAGES)} ({len(edges)} modules in "
          f"{len(LAYERS)} layers; module-level, function-level and TYPE_CHECKING imports counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
