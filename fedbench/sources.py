"""Where a researcher's own code comes from, and how it travels with a run: a Python file (with the modules it
imports from its own folder) or an importable module, hashed so that an edit re-runs the runs that use it, and
imported again in another process (a Ray worker, maybe on another machine) from the text a run carries.

The plugin loader (`fedbench.plugins`: algorithms and problems) and the network loader (`fedbench.networks`: a
torch module) both read code through here; this module imports neither, so that either may be imported by what the
other registers.
"""
from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ENTRY_POINT = "entry point "  # how an entry point's `Source.spec` starts


class PluginError(ValueError):
    """A plugin that cannot be registered (or a file that does not import, `import_source`); the message is one line:
    the plugin, then the cause."""


@dataclass(frozen=True)
class Source:
    """Where a plugin component's or a network's code is. `spec` as it was named (a file's absolute path, for a
    network followed by `:Class`; `module[:Class]`; or `entry point <group>:<name> (<package>)`), `path` the file
    whose text `sha256` hashes, and for a file that text itself (`text`) and the modules it imports from its folder
    (`modules`: path relative to the folder, text; `siblings`), which `sha256` covers too and a run carries to
    wherever it runs."""
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



def is_file(spec: str) -> bool:
    """Whether a plugin spec names a file (a `.py` name, or a path) rather than a module."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def located(spec: str, base: Path | None = None) -> str:
    """`spec` as `load` finds it: a file made absolute, relative to `base` (default: the working directory); a
    module spec as it is."""
    return str(((base or Path.cwd()) / Path(spec).expanduser()).resolve()) if is_file(spec) else spec



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


def file_source(spec: str, path: Path) -> Source:
    """The source of the file at `path` (named `spec`): its text, the modules it imports from its folder
    (`siblings`) and the sha256 of both."""
    text = path.read_text()
    modules = siblings(path, text)
    return Source(spec, str(path), file_sha256(text, modules), text, modules)


def import_source(source: Source, what: str = "plugin") -> ModuleType:
    """The module of a file's text (`source.text`), imported once per content as `source.module`, its sibling
    modules found where `provide` puts them; what does not import raises PluginError, naming it as `what`."""
    module = sys.modules.get(source.module)
    if module is None:
        provide(source)
        module = ModuleType(source.module)
        module.__file__ = source.path
        sys.modules[source.module] = module  # before running it: dataclasses and pickling look it up there
        try:
            assert source.text is not None  # a file's text
            exec(compile(source.text, source.path or source.module, "exec"), module.__dict__)
        except Exception as err:
            del sys.modules[source.module]
            raise PluginError(f"{what} {source.shown}: does not import: {describe(err)}") from None
    return module


def describe(err: BaseException) -> str:
    """An exception in one line: its type and message (a syntax error with its file and line)."""
    if isinstance(err, SyntaxError):
        return f"SyntaxError: {err.msg} ({Path(err.filename or '?').name}, line {err.lineno})"
    return f"{type(err).__name__}: {err}".splitlines()[0]
