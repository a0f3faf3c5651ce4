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

import importlib
import importlib.metadata
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from fedbench.algorithms import ALGORITHMS, Algorithm
from fedbench.hparams import Param
from fedbench.problems import PROBLEMS, Problem
from fedbench.problems.base import CONTRACT
from fedbench.sources import (
    ENTRY_POINT,
    PluginError,
    Source,
    describe,
    file_source,
    import_source,
    is_file,
    located,
    module_source,
)

GROUPS = {"algorithm": "fedbench.algorithms", "problem": "fedbench.problems"}
"""The entry-point groups an installed package declares its components in, by kind, each entry point named as the
component it loads: `[project.entry-points."fedbench.problems"]` `quadratic = "fedbench_fedopt.quadratic:Quadratic"`."""
REQUIRED = {"algorithm": ("client_step", "server_update"),
            "problem": tuple(hook for hook in CONTRACT if hook not in ("name", "params"))}
"""What a component must define itself, by kind (the base classes' versions raise NotImplementedError); besides,
its own `name` and its `Param` declarations (`hparams`, `params`): a problem's `CONTRACT`."""
DECLARED = {"algorithm": "hparams", "problem": "params"}  # its parameter declarations: a tuple of `Param`
BASES = {"algorithm": Algorithm, "problem": Problem}
REGISTRIES: dict[str, dict[str, Any]] = {"algorithm": ALGORITHMS, "problem": PROBLEMS}
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
        return load_source(file_source(str(path), path))
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
    return register_module(import_source(source), source)


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
    # looked up statically: a classmethod (`metrics`) read by getattr is a new bound method at every read
    missing = [method for method in REQUIRED[kind]
               if inspect.getattr_static(cls, method) is inspect.getattr_static(BASES[kind], method)]
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


