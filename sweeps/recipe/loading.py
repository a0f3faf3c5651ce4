"""Reading a recipe: YAML (safe_load only, `1e-3` a float, a key given twice refused, its size bounded),
`--set path=value` overrides, and `RecipeError`, the one-line refusal every check of the package raises (with
`closest`, the valid name nearest a misspelt one, and `in_words` and `shown`, what a YAML value is, for its
`found ...`).
"""
from __future__ import annotations

import difflib
import os
import re
import stat
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml


class DuplicateKey(yaml.YAMLError):
    """A mapping that gives a key more than once: PyYAML would keep the last one without a word."""

    def __init__(self, path: str, lines: list[int]):
        self.path, self.lines = path, lines
        super().__init__(f"{path}: given {len(lines)} times")


# What one recipe document may hold. A recipe is a few KB; these bound what reading one costs, whatever it holds:
# aliases are counted each time they are expanded, since what is built from the document (pydantic's checks, a
# refusal's `found ...`, the hashes of trials) expands them, so that an alias bomb (ten aliases of ten aliases ...
# of a string: 10^9 strings from 100 lines) is refused as soon as it is read, before anything expands it.
MAX_BYTES = 1 << 20  # the file
MAX_NODES = 100_000  # scalars, lists and mappings, aliases expanded (a seeds list of the most seeds takes 10,000)
MAX_TEXT = MAX_BYTES  # characters of the scalars, aliases expanded: a string repeated by aliases is as large
MAX_DEPTH = 32  # lists and mappings inside each other (a recipe nests 5 deep; PyYAML composes by recursion)


class TooLarge(yaml.YAMLError):
    """A document beyond what a recipe may hold, found while it is composed: at field `path`, what was found."""

    def __init__(self, path: str, message: str):
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}" if path else message)


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader (no tags that build Python objects) that also reads `1e-3` as a float, as YAML 1.2
    does (YAML 1.1 wants `1.0e-3` and would hand the researcher a string), refuses a key given twice
    in one mapping (DuplicateKey), and a document beyond the bounds above (TooLarge) while composing it."""

    def compose_document(self):
        self.expanded: dict[int, tuple[int, int]] = {}  # node id -> (nodes, characters), aliases expanded
        self.composed = 0
        self.at: list[str] = []  # the field path of the node being composed, one part per level
        return super().compose_document()

    def compose_node(self, parent, index):
        """The node, its expanded size measured from its children's (an alias's is its anchor's): each node is
        measured once, so that measuring costs what composing does, however far aliases would expand."""
        self.at.append(f"[{index}]" if isinstance(index, int) else f".{index.value}"
                       if isinstance(index, yaml.ScalarNode) else "")
        if len(self.at) > MAX_DEPTH:
            raise self.too_large(f"found values nested more than {MAX_DEPTH} levels deep, expected at most "
                                 f"{MAX_DEPTH}")
        alias = self.check_event(yaml.AliasEvent)
        node = super().compose_node(parent, index)
        if alias:
            if id(node) not in self.expanded:  # its anchor is still being composed: it holds itself
                raise self.too_large("found an alias inside its own anchor (a recursive value), expected a tree")
        else:
            self.composed += 1  # a long document without aliases is refused before it is all composed
            if self.composed > MAX_NODES:
                raise self.too_large(f"found more than {MAX_NODES} nodes, expected at most {MAX_NODES}")
            self.expanded[id(node)] = self.measure(node)
        nodes, characters = self.expanded[id(node)]
        if nodes > MAX_NODES:
            raise self.too_large(f"found {nodes} nodes with its aliases expanded, expected at most {MAX_NODES}")
        if characters > MAX_TEXT:
            raise self.too_large(f"found {in_bytes(characters)} of text with its aliases expanded, expected at "
                                 f"most {in_bytes(MAX_TEXT)}")
        self.at.pop()
        return node

    def measure(self, node: yaml.Node) -> tuple[int, int]:
        if isinstance(node, yaml.ScalarNode):
            return 1, len(node.value)
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        sizes = [self.expanded[id(child)] for child in children]
        return 1 + sum(n for n, _ in sizes), sum(c for _, c in sizes)

    def too_large(self, message: str) -> TooLarge:
        path = "".join(self.at).lstrip(".")
        return TooLarge(path if len(path) <= 60 else path[:60] + "…", message)  # a path 32 levels deep is long

    def construct_yaml_int(self, node):
        """An integer, or the refusal of one longer than Python reads (its ValueError would be a traceback)."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"found an integer of {len(node.value)} digits, expected at most "
                f"{sys.get_int_max_str_digits()}", node.start_mark) from None

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


RecipeLoader.add_constructor("tag:yaml.org,2002:int", RecipeLoader.construct_yaml_int)
RecipeLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_value(text: str) -> Any:
    return yaml.load(text, Loader=RecipeLoader)


# Characters of a refusal's message. A found value is cut to 40 where the package shows one (`shown`), which keeps a
# line near 160; this cut, the last resort, leaves room for what a message must say whole: two absolute paths.
LONGEST_MESSAGE = 400


class RecipeError(ValueError):
    """One line (file, field path, what was found, what was expected), short enough to read at a glance;
    `detail`, what explains it further, is shown on a second line by `fedbench -v`."""

    def __init__(self, source: str, path: str, message: str, detail: str = ""):
        if len(message) > LONGEST_MESSAGE:  # a value the engine's own checks put in whole (`found {value!r}`)
            message = f"{message[:LONGEST_MESSAGE]}… ({in_bytes(len(message))})"
        self.source, self.path, self.message, self.detail = source, path, message, detail
        super().__init__(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def closest(name: str, options) -> str:
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def unknown(source: str, path: str, message: str, options) -> RecipeError:
    """The refusal of a name that is none of `options` (a problem, algorithm, parameter, field or metric): `message`
    (what was found, the closest valid name) on the first line, every valid name, too many for it, on the -v line."""
    return RecipeError(source, path, f"{message}; -v lists the valid names", f"expected one of {', '.join(options)}")


# What `read_yaml` calls a file that is not a regular one: opening a FIFO for reading blocks until a writer comes
NOT_REGULAR = {stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
               stat.S_ISDIR: "a folder", stat.S_ISSOCK: "a socket"}


def read_yaml(path: str | Path) -> dict[str, Any]:
    source = str(path)
    try:
        mode = os.stat(path).st_mode  # before opening: a FIFO's open would wait for a writer for ever
        kind = next((name for test, name in NOT_REGULAR.items() if test(mode)), None)
        if kind is not None:
            raise RecipeError(source, "", f"found {kind}, expected a regular file holding a recipe")
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)  # no more: a file may grow while it is read
    except OSError as err:
        raise RecipeError(source, "", f"cannot read the file ({err.strerror})") from None
    if len(data) > MAX_BYTES:
        raise RecipeError(source, "", f"the file holds more than {in_bytes(MAX_BYTES)}, expected a recipe of at "
                          f"most {in_bytes(MAX_BYTES)}")
    try:
        text = data.decode()
    except UnicodeDecodeError as err:
        raise RecipeError(source, "", f"the file is not UTF-8 text (byte {data[err.start]:#x} at offset "
                          f"{err.start})") from None
    try:
        raw = yaml_value(text)
    except TooLarge as err:
        raise RecipeError(source, err.path, err.message) from None
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
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {shown(value)}"
    if isinstance(value, list):
        return "a list"
    return f"the {type(value).__name__} {value}"  # a date or a timestamp


def shown(value: Any, limit: int = 40) -> str:
    """A found value as YAML wrote it (its repr), cut after `limit` characters with its whole size, so that a
    refusal stays one short line whatever was found (the bounds of a document keep the whole repr small)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({in_bytes(len(text))})"


def in_bytes(count: int) -> str:
    """A size in bytes (or characters) in binary units: 391 KiB, 1 MiB, 64 TiB."""
    value, units = float(count), ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.0f} {units[0]}" if value >= 10 or value.is_integer() else f"{value:.1f} {units[0]}"


def apply_overrides(raw: dict[str, Any], assignments: list[str], source: str, algorithm: str | None = None) -> dict:
    """`path=value` assignments (value parsed as YAML); `algorithm.x` means the selected algorithm's x."""
    for assignment in assignments:
        path, sep, text = assignment.partition("=")
        if not sep or not path:
            raise RecipeError(source, "--set", f"expected path=value, found {shown(assignment)}")
        keys = path.split(".")
        if keys[0] == "algorithm":
            listed = raw.get("algorithms")
            if algorithm is None and isinstance(listed, dict) and len(listed) == 1:
                algorithm = next(iter(listed))
            if algorithm is None:
                raise RecipeError(source, "--set", f"{path!r} needs a selected algorithm; "
                                                   f"write algorithms.NAME.{'.'.join(keys[1:])}")
            keys = ["algorithms", algorithm, *keys[1:]]
        try:
            value = yaml_value(text)
        except TooLarge as err:
            raise RecipeError(source, "--set", f"{path}: {err.message}") from None
        except yaml.YAMLError:
            raise RecipeError(source, "--set", f"cannot parse the value of {path!r}: {shown(text)}") from None
        listed = raw.get("algorithms")
        if value is None and len(keys) == 2 and keys[0] == "algorithms" and isinstance(listed, dict) and \
                keys[1] in listed:  # YAML's `fedda:` (null) is fedda at its defaults: no way to leave it out
            raise RecipeError(source, "--set", f"{path}=null: found null for an algorithm the recipe runs, which would "
                              f"run it at its default hyperparameters, not leave it out; expected -a NAME for each "
                              f"algorithm to run, or {path}={{}} for its defaults")
        set_field(raw, keys, value, source, path)
    return raw


def set_field(raw: dict[str, Any], keys: list[str], value: Any, source: str, path: str) -> None:
    """Set the field at `keys` (a path split at its dots, `federation.uplink.0.top_k`) of a recipe document to
    `value`, making the mappings on the way where missing: what `--set` does, and what a tuned trial's values do
    (`sweeps.recipe.assigned`). Refused at `path`: a part that no mapping or list entry can hold."""
    node: Any = raw
    for key in keys[:-1]:
        node = _inner(node, key, source, path)
    if isinstance(node, list):
        node[_index(node, keys[-1], source, path)] = value
    else:
        node[keys[-1]] = value


def _index(node: list, key: str, source: str, path: str) -> int:
    """A list's entry by its index (`federation.uplink.0`); the index past its end adds one (an empty mapping)."""
    if not (key.isdigit() and int(key) <= len(node)):
        raise RecipeError(source, path, f"found {key!r} for an entry of a list of {len(node)}, expected its index, 0 "
                          f"to {len(node)} (the last adds an entry)")
    if int(key) == len(node):
        node.append({})
    return int(key)


def _inner(node: Any, key: str, source: str, path: str) -> Any:
    """The field `key` of a mapping (made where missing) or the entry `key` of a list: where a deeper field is set. A
    list's entry that is a name alone (a chain's `error_feedback`, its defaults) becomes the mapping it stands for
    (`{error_feedback: null}`), so that its parameter can be set (`federation.uplink.1.error_feedback=ef21`)."""
    if isinstance(node, list):
        index = _index(node, key, source, path)
        if isinstance(node[index], str):
            node[index] = {node[index]: None}
        node = node[index]
    else:
        node = node.setdefault(key, {})
    if not isinstance(node, (dict, list)):
        raise RecipeError(source, path, "cannot set a field inside a non-mapping")
    return node

