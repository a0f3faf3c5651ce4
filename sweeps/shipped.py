"""The recipes shipped with fedbench, by name: `papers/bao2022_lasso` is recipes/papers/bao2022_lasso.yaml of the
repository, installed as package data (fedbench_sweeps/recipes/). `fedbench sweep papers/bao2022_lasso` runs it
from any folder; `fedbench recipes` lists them with what a recipe's first comment lines say of it:

    # paper: Bao, Crawshaw, Luo, Liu, ICML 2022 (Fast-FedDA)
    # reproduces: Fig. 1: federated Lasso, five methods
    # time on 2 cores: ~2 min (make demo)

and `# time on one GPU:` (the GPU named in its parentheses); `—` for a line left out: a time is given only where one
was measured (bench/gallery.py measures them and writes these lines).
"""
from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path

SUFFIXES = (".yaml", ".yml")
FIELDS = ("paper", "reproduces", "time on 2 cores", "time on one GPU")
FIELD_LINE = re.compile(rf"#\s*({'|'.join(FIELDS)})\s*:\s*(.+?)\s*$")


def root() -> Path:
    """The folder of the shipped recipes: installed, the package's own `recipes` (package data); in a checkout
    or an editable install (a source tree: pyproject.toml beside sweeps/), the repository's recipes/."""
    installed = Path(str(resources.files(__package__) / "recipes"))
    source_tree = Path(__file__).resolve().parents[1]
    if not installed.is_dir() and (source_tree / "pyproject.toml").is_file():
        return source_tree / "recipes"
    return installed


def names() -> list[str]:
    """Every shipped recipe's name, as typed: its path under recipes/ without `.yaml`."""
    base = root()
    if not base.is_dir():
        return []
    return sorted(path.relative_to(base).with_suffix("").as_posix() for path in base.rglob("*")
                  if path.suffix in SUFFIXES and path.is_file())


def name_of(given: str | Path) -> str:
    """`papers/bao2022_lasso` for papers/bao2022_lasso, papers/bao2022_lasso.yaml and the repository's path
    recipes/papers/bao2022_lasso.yaml."""
    text = Path(given).as_posix()
    for suffix in SUFFIXES:
        text = text.removesuffix(suffix)
    return text.removeprefix("./").removeprefix("recipes/")


def find(given: str | Path) -> Path | None:
    """The file of the shipped recipe `given` names (None: none by that name); relative to the working directory
    where it lies under it (a checkout's recipes/...), so that messages name it as one would type it."""
    name = name_of(given)
    if name not in names():
        return None
    path = next(root() / f"{name}{suffix}" for suffix in SUFFIXES if (root() / f"{name}{suffix}").is_file())
    here = Path.cwd().resolve()
    return path.resolve().relative_to(here) if path.resolve().is_relative_to(here) else path


def closest(given: str | Path) -> str | None:
    """The shipped name nearest `given` (also by its last part: `bao2022_lasso` finds `papers/bao2022_lasso`)."""
    name, known = name_of(given), names()
    by_stem = {known_name.rsplit("/", 1)[-1]: known_name for known_name in known}
    if name.rsplit("/", 1)[-1] in by_stem:
        return by_stem[name.rsplit("/", 1)[-1]]
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return match[0] if match else None


def describe(path: Path) -> dict[str, str]:
    """The `# paper:`, `# reproduces:`, `# time on 2 cores:` and `# time on one GPU:` lines of a recipe's first
    comment block."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        if match := FIELD_LINE.match(line):
            found.setdefault(match.group(1), match.group(2))
    return found
