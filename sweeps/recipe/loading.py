"""Reading a recipe: YAML (safe_load only, `1e-3` a float, a key given twice refused), `--set path=value`
overrides, and `RecipeError`, the one-line refusal every check of the package raises (with `closest`, the
valid name nearest a misspelt one, and `in_words`, what a YAML value is, for its `found ...`).
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml


class DuplicateKey(yaml.YAMLError):
    """A mapping that gives a key more than once: PyYAML would keep the last one without a word."""

    def __init__(self, path: str, lines: list[int]):
        self.path, self.lines = path, lines
        super().__init__(f"{path}: given {len(lines)} times")


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader (no tags that build Python objects) that also reads `1e-3` as a float, as YAML 1.2
    does (YAML 1.1 wants `1.0e-3` and would hand the researcher a string), and refuses a key given twice
    in one mapping (DuplicateKey)."""

    def construct_document(self, node):
        self.paths = field_paths(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        lines: dict[Any, list[int]] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then a key overrides base's, as meant
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):  # an unhashable key is refused by SafeLoader itself
                lines.setdefault(key, []).append(key_node.start_mark.line + 1)
        for key, found in lines.items():
            if len(found) > 1:
                path = self.paths.get(id(node), "")
                raise DuplicateKey(f"{path}.{key}" if path else str(key), found)
        return super().construct_mapping(node, deep)


def field_paths(root: yaml.Node) -> dict[int, str]:
    """The field path (`algorithms.fedavg`, `report.metrics[0]`) of each node of a document, by node id."""
    paths: dict[int, str] = {}
    pending = [(root, "")]
    while pending:
        node, path = pending.pop()
        if id(node) in paths:  # an alias: the node is where its anchor is (and a recursive one ends here)
            continue
        paths[id(node)] = path
        if isinstance(node, yaml.MappingNode):
            pending += [(value, f"{path}.{key.value}" if path else key.value)
                        for key, value in node.value if isinstance(key, yaml.ScalarNode)]
        elif isinstance(node, yaml.SequenceNode):
            pending += [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
    return paths


RecipeLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_value(text: str) -> Any:
    return yaml.load(text, Loader=RecipeLoader)


class RecipeError(ValueError):
    """One line (file, field path, what was found, what was expected), short enough to read at a glance;
    `detail`, what explains it further, is shown on a second line by `fedbench -v`."""

    def __init__(self, source: str, path: str, message: str, detail: str = ""):
        self.source, self.path, self.message, self.detail = source, path, message, detail
        super().__init__(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def closest(name: str, options) -> str:
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def unknown(source: str, path: str, message: str, options) -> RecipeError:
    """The refusal of a name that is none of `options` (a problem, algorithm, parameter, field or metric): `message`
    (what was found, the closest valid name) on the first line, every valid name, too many for it, on the -v line."""
    return RecipeError(source, path, f"{message}; -v lists the valid names", f"expected one of {', '.join(options)}")


def read_yaml(path: str | Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise RecipeError(source, "", f"cannot read the file ({err.strerror})") from None
    try:
        raw = yaml_value(text)
    except DuplicateKey as err:
        lines = sorted(set(err.lines))  # one line when a flow mapping ({a: 1, a: 2}) repeats it
        where = f"line {lines[0]}" if len(lines) == 1 else f"lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"
        count = "twice" if len(err.lines) == 2 else f"{len(err.lines)} times"
        raise RecipeError(source, err.path, f"given {count} ({where}); expected once") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "python/" in problem:
            problem = "a !!python tag is refused (recipes are read with safe_load and never build objects)"
        raise RecipeError(source, "", f"malformed YAML: {where}{problem}") from None
    expected = "expected a mapping at the top level (problem:, algorithms:, federation:, seeds: ...)"
    if raw is None:  # nothing, only comments, a bare `---` (or a lone `null`)
        raise RecipeError(source, "", f"the file is empty; {expected}")
    if not isinstance(raw, dict):
        raise RecipeError(source, "", f"found {in_words(raw)}; {expected}")
    return raw


def in_words(value: Any) -> str:
    """What a YAML value is, for a `found ...` (not Python's type names: a researcher wrote YAML)."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value if len(value) <= 40 else value[:40] + '…'!r}"
    if isinstance(value, list):
        return "a list"
    return f"the {type(value).__name__} {value}"  # a date or a timestamp


def apply_overrides(raw: dict[str, Any], assignments: list[str], source: str, algorithm: str | None = None) -> dict:
    """`path=value` assignments (value parsed as YAML); `algorithm.x` means the selected algorithm's x."""
    for assignment in assignments:
        path, sep, text = assignment.partition("=")
        if not sep or not path:
            raise RecipeError(source, "--set", f"expected path=value, found {assignment!r}")
        keys = path.split(".")
        if keys[0] == "algorithm":
            listed = raw.get("algorithms")
            if algorithm is None and isinstance(listed, dict) and len(listed) == 1:
                algorithm = next(iter(listed))
            if algorithm is None:
                raise RecipeError(source, "--set", f"{path!r} needs a selected algorithm; write algorithms.NAME.{'.'.join(keys[1:])}")
            keys = ["algorithms", algorithm, *keys[1:]]
        try:
            value = yaml_value(text)
        except yaml.YAMLError:
            raise RecipeError(source, "--set", f"cannot parse the value of {path!r}: {text!r}") from None
        node = raw
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise RecipeError(source, path, "cannot set a field inside a non-mapping")
        node[keys[-1]] = value
    return raw

