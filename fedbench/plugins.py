"""Researchers' own algorithms and problems, registered beside the built-in ones: from a Python file, from an
importable module (`my_pkg.methods` or `my_pkg.methods:MyMethod`), or from an installed package's entry points
(groups `fedbench.algorithms` and `fedbench.problems`, each entry point named as the component it loads).

A component is a subclass of `Algorithm` or `Problem` with its own `name`; it is then found by name in
`ALGORITHMS` / `PROBLEMS` like a built-in one. Where its code came from is its `Source` (`ORIGINS`): a file's
text travels with each run that uses it (`Source.text`, so that a worker on another machine loads the same code,
`ensure`) and its sha256 enters the run's configuration, so that an edit re-runs the runs that use it. The modules
a file imports from its own folder (`from helpers import step` beside `my_method.py`) are part of its code: found
statically (`siblings`), hashed with it and carried with it (`Source.modules`).

What cannot be registered raises `PluginError`, whose message is one line naming the plugin and the cause: a
name given to a built-in or to another plugin, a file or module that does not import (the import's own error),
a file that defines no component, a class that is no component or lacks a method every component must have.
"""
from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from fedbench.algorithms import ALGORITHMS, Algorithm
from fedbench.hparams import Param
from fedbench.problems import PROBLEMS, Problem

GROUPS = {"algorithm": "fedbench.algorithms", "problem": "fedbench.problems"}
"""The entry-point groups an installed package declares its components in, by kind, each entry point named as the
component it loads: `[project.entry-points."fedbench.problems"]` `quadratic = "fedbench_fedopt.quadratic:Quadratic"`."""
ENTRY_POINT = "entry point "  # how an entry point's `Source.spec` starts
REQUIRED = {"algorithm": ("client_step", "server_update"),
            "problem": ("init_params", "gather", "minibatch_loss", "metrics", "evaluate_global")}
"""What a component must define itself, by kind (the base classes' versions raise NotImplementedError); besides,
its own `name` and its `Param` declarations (`hparams`, `params`)."""
DECLARED = {"algorithm": "hparams", "problem": "params"}  # its parameter declarations: a tuple of `Param`
BASES = {"algorithm": Algorithm, "problem": Problem}
REGISTRIES: dict[str, dict[str, Any]] = {"algorithm": ALGORITHMS, "problem": PROBLEMS}


class PluginError(ValueError):
    """A plugin that cannot be registered; the message is one line: the plugin, then the cause."""


@dataclass(frozen=True)
class Source:
    """Where a plugin component's code is. `spec` as it was named (a file's absolute path, `module[:Class]`, or
    `entry point <group>:<name> (<package>)`), `path` the file whose text `sha256` hashes, and for a file plugin
    that text itself (`text`) and the modules it imports from its folder (`modules`: path relative to the folder,
    text; `siblings`), which `sha256` covers too and a run carries to wherever it runs."""
    spec: str
    path: str | None
    sha256: str
    text: str | None = None
    modules: tuple[tuple[str, str], ...] = ()

    @property
    def shown(self) -> str:
        """The plugin as an error names it: a file by its name, else its spec."""
        return Path(self.path).name if self.text is not None and self.path else self.spec

    @property
    def from_entry_point(self) -> bool:
        return self.spec.startswith(ENTRY_POINT)

    @property
    def module(self) -> str:
        """The module name a file plugin's code is imported as: one per file content."""
        return f"fedbench_plugin_{Path(self.path or 'plugin').stem}_{self.sha256[:12]}"


ORIGINS: dict[tuple[str, str], Source] = {}
"""Where each registered plugin component came from: (kind, name) -> its `Source` (built-in ones are absent)."""
BUILT_IN = {kind: frozenset(registry) for kind, registry in REGISTRIES.items()}
_BROKEN: dict[tuple[str, str], str] = {}  # entry points that failed to load: why (raised only when named)
_discovered = False


def kind_of(cls: Any) -> str | None:
    """"algorithm", "problem", or None for anything else."""
    if inspect.isclass(cls):
        for kind, base in BASES.items():
            if issubclass(cls, base) and cls is not base:
                return kind
    return None


def origin(kind: str, name: str) -> str:
    """Where a registered component came from, in words: "built-in", or its plugin's spec."""
    source = ORIGINS.get((kind, name))
    return "built-in" if source is None else source.spec


def sources(kind: str, name: str) -> tuple[Source, ...]:
    """The plugin source of a registered component (empty for a built-in one)."""
    source = ORIGINS.get((kind, name))
    return () if source is None else (source,)


def is_file(spec: str) -> bool:
    """Whether a plugin spec names a file (a `.py` name, or a path) rather than a module."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def located(spec: str, base: Path | None = None) -> str:
    """`spec` as `load` finds it: a file made absolute, relative to `base` (default: the working directory); a
    module spec as it is."""
    return str(((base or Path.cwd()) / Path(spec).expanduser()).resolve()) if is_file(spec) else spec


def load(spec: str, base: Path | None = None) -> list[tuple[str, str]]:
    """Register the components that `spec` names: a `.py` file (relative to `base`, default the working
    directory), or `module[:Class]`; what cannot be registered raises `PluginError`. Returns (kind, name) of each,
    in the order the plugin defines them; each is then found by name in `ALGORITHMS` / `PROBLEMS`.

    Example:
        ```python
        from fedbench import plugins

        plugins.load("my_method.py")                           # [("algorithm", "my_method")]
        fedbench.run("my_method", problem, rounds=200)
        plugins.load("my_pkg.methods:MyMethod")
        ```
    """
    if is_file(spec):
        path = Path(located(spec, base))
        if not path.is_file():
            raise PluginError(f"plugin {spec}: no such file ({path})")
        text = path.read_text()
        modules = siblings(path, text)
        return load_source(Source(str(path), str(path), file_sha256(text, modules), text, modules))
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the import's own message: a missing dependency, a syntax error, ...
        raise PluginError(f"plugin {spec}: does not import: {describe(err)}") from None
    source = module_source(spec, module)
    if attribute:
        if not hasattr(module, attribute):
            raise PluginError(f"plugin {spec}: module {module_name} has no attribute {attribute!r}")
        return [register(getattr(module, attribute), source)]
    return register_module(module, source)


def load_source(source: Source) -> list[tuple[str, str]]:
    """Register the components of a file plugin's text (imported once per content, as `source.module`)."""
    module = sys.modules.get(source.module)
    if module is None:
        provide(source)
        module = ModuleType(source.module)
        module.__file__ = source.path
        sys.modules[source.module] = module  # before running it: dataclasses and pickling look it up there
        try:
            assert source.text is not None  # a file plugin's text
            exec(compile(source.text, source.path or source.module, "exec"), module.__dict__)
        except Exception as err:
            del sys.modules[source.module]
            raise PluginError(f"plugin {source.shown}: does not import: {describe(err)}") from None
    return register_module(module, source)


def ensure(needed: tuple[Source, ...]) -> None:
    """Make sure the plugin components a run uses are registered in this process (a Ray worker, maybe on another
    machine): a file plugin from the text the run carries, a module or entry point by importing it again."""
    for source in needed:
        if source.text is not None:
            load_source(source)
        elif source.from_entry_point:
            discover()
        else:
            load(source.spec)


def siblings(path: Path, text: str) -> tuple[tuple[str, str], ...]:
    """The modules a file plugin imports from its own folder, and those they import from it, transitively: (path
    relative to the folder, text) of each, sorted. Found statically (`ast`) from `import x` and `from x import y`
    wherever they are (a function's own imports too), where the folder holds a module `x.py` or a package `x/`; of
    a package every `.py` file is taken, so that its relative imports need no resolving. The plugin's own relative
    imports need none either: it is imported as a top-level module, where Python refuses them. Not taken: what an
    import names only at run time (`importlib.import_module`), data files, and a name of Python's own or of an
    installed package (every node has those; a copy of fedbench beside the plugin is not the plugin's code)."""
    folder, found, seen, pending = path.parent, {}, set[str](), [text]
    while pending:
        for name in sorted(imported_names(pending.pop()) - seen - installed_names()):
            seen.add(name)
            for file in module_files(folder, name):
                relative = file.relative_to(folder).as_posix()
                if relative not in found:
                    found[relative] = file.read_text()
                    pending.append(found[relative])
    return tuple(sorted(found.items()))


def imported_names(text: str) -> set[str]:
    """The top-level names of the absolute imports in a module's text (none where it does not parse: importing it
    then says why, with the line)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def module_files(folder: Path, name: str) -> list[Path]:
    """The files of the module `name` that an import finds in `folder`, in Python's order: a package (`name/` with
    an `__init__.py`), else a module `name.py`, else a namespace package (a folder `name/`); none if neither."""
    package, module = folder / name, folder / f"{name}.py"
    if (package / "__init__.py").is_file() or (package.is_dir() and not module.is_file()):
        return sorted(package.rglob("*.py"))
    return [module] if module.is_file() else []


@functools.cache
def installed_names() -> frozenset[str]:
    """Top-level names no plugin folder provides: Python's own modules and those of installed distributions."""
    return frozenset(sys.stdlib_module_names) | frozenset(importlib.metadata.packages_distributions())


def file_sha256(text: str, modules: tuple[tuple[str, str], ...]) -> str:
    """A file plugin's sha256: of its text and each sibling module's path and text. A plugin that imports nothing
    from its folder hashes as its text alone, as before modules were hashed: its runs keep their config hash."""
    digest = hashlib.sha256(text.encode())
    for relative, module_text in modules:
        digest.update(b"\0" + relative.encode() + b"\0" + module_text.encode())
    return digest.hexdigest()


_PROVIDED: dict[str, str] = {}  # a file plugin's sha256 -> the private folder its sibling modules were written to


def provide(source: Source) -> None:
    """Make a file plugin's imports of its sibling modules find the texts it carries (those its sha256 covers):
    written to a private folder of this process (removed at its exit) first on sys.path. Not the plugin's own
    folder: a worker on another machine has none, and the driver's may have changed since the plugin was read.
    The folder stays on sys.path, as a script's folder does, for imports inside functions."""
    if not source.modules:
        return
    folder = _PROVIDED.get(source.sha256)
    if folder is None:
        folder = tempfile.mkdtemp(prefix=f"fedbench_plugin_{Path(source.path or 'plugin').stem}_")
        atexit.register(shutil.rmtree, folder, True)
        for relative, text in source.modules:
            file = Path(folder, relative)
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text)
        _PROVIDED[source.sha256] = folder
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    importlib.invalidate_caches()  # the import system's cached folder listings predate these files
    # A module of one of these names imported already (an older version of the helper, the same name beside
    # another plugin, the plugin's own folder on sys.path) would be used instead: imported again from here.
    names = {Path(relative).parts[0].removesuffix(".py") for relative, _ in source.modules}
    for name in [name for name in sys.modules if name.partition(".")[0] in names]:
        module = sys.modules[name]
        files = [getattr(module, "__file__", None) or "", *getattr(module, "__path__", [])]
        if not any(str(file).startswith(folder + os.sep) for file in files):
            del sys.modules[name]


def register_module(module: ModuleType, source: Source) -> list[tuple[str, str]]:
    """Register every component a module defines itself (not those it imports)."""
    found = [value for value in vars(module).values() if kind_of(value) and value.__module__ == module.__name__
             and "name" in vars(value)]
    if not found:
        raise PluginError(f"plugin {source.shown}: defines no algorithm or problem (a subclass of "
                          "fedbench.algorithms.Algorithm or fedbench.problems.Problem with its own `name`)")
    return [register(cls, source) for cls in found]


def register(cls: Any, source: Source) -> tuple[str, str]:
    """Register one component, as coming from `source`; PluginError if it is none, is incomplete (`REQUIRED`), or
    takes a name already taken. Returns its (kind, name)."""
    kind = kind_of(cls)
    what = getattr(cls, "__name__", repr(cls))
    if kind is None:
        raise PluginError(f"plugin {source.shown}: {what} is not an algorithm or problem (a subclass of "
                          "fedbench.algorithms.Algorithm or fedbench.problems.Problem)")
    name = vars(cls).get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise PluginError(f"plugin {source.shown}: {kind} {what} needs a `name`, a Python identifier "
                          f"(found {name!r})")
    missing = [method for method in REQUIRED[kind] if getattr(cls, method) is getattr(BASES[kind], method)]
    if missing:
        raise PluginError(f"plugin {source.shown}: {kind} {name} does not define {', '.join(missing)}")
    declared = getattr(cls, DECLARED[kind], None)
    if not isinstance(declared, tuple) or not all(isinstance(p, Param) for p in declared):
        raise PluginError(f"plugin {source.shown}: {kind} {name}: `{DECLARED[kind]}` must be a tuple of "
                          "fedbench.hparams.Param")
    registry, held = REGISTRIES[kind], ORIGINS.get((kind, name))
    if name in BUILT_IN[kind]:
        raise PluginError(f"plugin {source.shown}: {kind} name {name!r} is taken by the built-in {kind}")
    if name in registry and registry[name] is not cls and (held is None or held.path != source.path
                                                           or held.spec != source.spec):
        raise PluginError(f"plugin {source.shown}: {kind} name {name!r} is taken by plugin "
                          f"{held.shown if held else '?'}")
    registry[name] = cls  # the same file edited since replaces its older version
    ORIGINS[(kind, name)] = source
    return kind, name


def discover() -> None:
    """Register the components of every installed package's entry points (`GROUPS`), once per process. An entry
    point that fails to load is remembered (`broken`) and refused only where a recipe names it.

    Example:
        ```python
        plugins.discover()
        plugins.origin("problem", "quadratic")   # 'entry point fedbench.problems:quadratic (fedbench-fedopt)'
        ```
    """
    global _discovered
    if _discovered:
        return
    _discovered = True
    for kind, group in GROUPS.items():
        for point in importlib.metadata.entry_points(group=group):
            package = point.dist.name if point.dist is not None else "?"
            spec = f"{ENTRY_POINT}{group}:{point.name} ({package})"
            try:
                cls = point.load()
                registered = register(cls, module_source(spec, sys.modules[cls.__module__]))
                if registered != (kind, point.name):
                    raise PluginError(f"plugin {spec}: loads {registered[0]} {registered[1]!r}, not {kind} "
                                      f"{point.name!r}")
            except PluginError as err:
                _BROKEN[(kind, point.name)] = str(err)
            except Exception as err:
                _BROKEN[(kind, point.name)] = f"plugin {spec}: does not import: {describe(err)}"


def broken(kind: str, name: str) -> str | None:
    """Why an installed entry point of this name did not load (None: there is none, or it loaded)."""
    return _BROKEN.get((kind, name))


def broken_entry_points() -> dict[tuple[str, str], str]:
    """Every installed entry point that did not load: (kind, name) -> why."""
    return dict(_BROKEN)


def module_source(spec: str, module: ModuleType) -> Source:
    """A module plugin's source: its file, and the sha256 of every Python file of its top-level package (a
    subclass's update rule may live in a sibling module: editing that one re-runs the runs too)."""
    path = getattr(module, "__file__", None)
    top = sys.modules.get(module.__name__.partition(".")[0])
    entries = [(str(file.relative_to(folder)), file) for folder in map(Path, getattr(top, "__path__", []))
               for file in sorted(folder.rglob("*.py"))]
    if not entries and path:  # a module of its own, not in a package
        entries = [(Path(path).name, Path(path))]
    digest = hashlib.sha256()
    for name, file in entries:
        digest.update(name.encode() + b"\0" + file.read_bytes())
    return Source(spec, path, digest.hexdigest() if entries else "")


def describe(err: BaseException) -> str:
    """An exception in one line: its type and message (a syntax error with its file and line)."""
    if isinstance(err, SyntaxError):
        return f"SyntaxError: {err.msg} ({Path(err.filename or '?').name}, line {err.lineno})"
    return f"{type(err).__name__}: {err}".splitlines()[0]
