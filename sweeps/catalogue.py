"""What `fedbench list` prints: the declarations of problems, algorithms, the shipped networks, the federation's
fields, the transforms of its links, privacy accounting, capabilities and schedules, as entries that a NAME selects,
in plain text wrapped at word boundaries to the terminal's width (no table: its narrow columns split words, and no
Rich markup: it ate every `[p_low, p_high]`). The same entries (`entries`) are the catalogue the site's reference
pages are written from (docs/hooks/reference.py), each with what declares it."""
from __future__ import annotations

import difflib
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, Sequence

from fedbench import plugins
from fedbench.axes.registry import Chain, FederationAxis, Section, in_federation, sections
from fedbench.axes.transforms import TRANSFORMS
from fedbench.engine.dry_round import takes_uneven_steps
from fedbench.hparams import Param, resolve

TRANSFORM_VALUE = "value its first parameter, or {parameter: value}"  # how a chain's step is written
UNEVEN = "federation.local_steps as a mapping"  # how a recipe gives each participant its own number of local steps
OWN_NETWORK = "path/to/file.py:ClassName or package.module:ClassName"  # how a recipe names a researcher's own network
# the sections of the overview: a top-level axis of the registry (`fedbench.axes.registry.sections`: privacy, compile)
# is one
SECTIONS = ("problems", "algorithms", "networks", "federation", "transforms", *(axis.key for axis in sections()),
            "capabilities", "schedules")
# a summary's end: the first `.`, `:` or `;` before a space outside parentheses, but for an abbreviation's dot
SENTENCE_END = re.compile(r"(?<!\bal)(?<!\bet)(?<!\be\.g)(?<!\bi\.e)(?<!\bcf)[.:;](?=\s|$)")


@dataclass
class Entry:
    """One thing `fedbench list` describes: selected by its `path` (or its own name, the path's last part), shown in
    the overview as its name and `summary`, and in full as its `heading`, its parameters and its `notes`."""
    path: str  # algorithms.fedavg, problems.lasso, federation.local_steps, transforms.top_k, privacy
    heading: str
    summary: str
    params: Sequence[Param] = ()
    notes: list[str] = field(default_factory=list)
    # what declares it, which the reference pages read beyond what `fedbench list` prints: a problem's or algorithm's
    # class, a network, the class of a federation's mapping, a transform, the kinds of schedule (by name)
    declared: Any = None

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]


def summary_of(cls) -> str:
    """A component's first sentence: its module's docstring (the reference pages' opening) or its class's."""
    text = " ".join(inspect.cleandoc(sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").split("\n\n")[0].split())
    depth = 0
    for i, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0 and SENTENCE_END.match(text, i):
            return text[:i]
    return text.rstrip(".")


def takes_uneven(cls) -> tuple[bool, list[str]]:
    """Whether an algorithm takes uneven local work with its default hyperparameters (as its dry round finds it,
    `fedbench.engine.dry_round.takes_uneven_steps`), and the choices that change that (`server_threshold: yuan`)."""
    defaults = resolve(cls.hparams, {}, cls.name)
    takes = takes_uneven_steps(cls, defaults)
    changed = []
    for p in cls.hparams:
        for value in p.choices if p.kind == "choice" else (True, False) if p.kind == "bool" else ():
            if value != defaults[p.name] and takes_uneven_steps(cls, {**defaults, p.name: value}) != takes:
                changed.append(f"{p.name}: {str(value).lower() if isinstance(value, bool) else value}")
    return takes, changed


def contract_lines(kind: str, cls) -> list[str]:
    """What `fedbench list` says under a component's parameters: presets, metrics, capabilities; of an algorithm,
    whether it takes uneven local work (the reference pages print the same lines)."""
    if kind == "algorithm":
        requires = sorted(cls.requirements(resolve(cls.hparams, {}, cls.name)))
        lines = [f"requires (default hyperparameters): {', '.join(requires) or 'minibatch gradients only'}"]
        takes, changed = takes_uneven(cls)
        lines.append(f"uneven local work ({UNEVEN}): {'taken' if takes else 'refused'}"
                     + (f", but {'not ' if takes else ''}with {' or '.join(changed)}" if changed else ""))
        if cls.participation == "all":
            lines.append("every client takes part in every round")
        return lines
    config = cls.resolve_config({})
    lines = [f"presets: {', '.join(cls.presets)}"] if cls.presets else []
    lines.append(f"provides: {', '.join(sorted(cls.capabilities(config)))}")
    lines.append("metrics: " + ", ".join(f"{m.name} ({m.direction or '–'})" for m in cls.metrics(config)))
    if "personal_evaluation" in cls.capabilities(config):
        lines.append("personal metrics: " + ", ".join(m.personal().name for m in cls.personal_metrics(config)))
    return lines


def entries() -> list[Entry]:
    """Everything `fedbench list` knows, in the order it prints it (plugins as registered now)."""
    from fedbench.algorithms import ALGORITHMS
    from fedbench.contract import CAPABILITIES
    from fedbench.networks import NETWORKS
    from fedbench.problems import PROBLEMS
    from fedbench.schedules import KINDS
    from .recipe import FEDERATION_PARAMS

    found = []
    for kind, section, registry, attribute in (("problem", "problems", PROBLEMS, "params"),
                                               ("algorithm", "algorithms", ALGORITHMS, "hparams")):
        for name, cls in registry.items():
            where = plugins.origin(kind, name)
            origin = "" if where == "built-in" else f" (plugin: {where})"
            summary = summary_of(cls)
            if kind == "algorithm" and takes_uneven(cls)[0]:
                summary = f"* {summary}"
            found.append(Entry(f"{section}.{name}", f"{kind} {name}{origin}", summary + origin,
                               getattr(cls, attribute), contract_lines(kind, cls), declared=cls))
    for name, network in NETWORKS.items():
        shape = "×".join(map(str, network.input_shape))
        found.append(Entry(f"networks.{name}", f"network {name}: {network.parameters:,} parameters, input {shape}, "
                           f"{network.classes} classes; {network.source}",
                           f"{network.parameters:,} parameters, {shape} → {network.classes}: {network.source}",
                           declared=network))
    found.append(Entry("federation", "federation: how rounds run (a list is a grid axis)",
                       "rounds, clients per round, local steps, batch size, aggregation", FEDERATION_PARAMS))
    for axis in in_federation():
        found.append(axis_entry(axis))
    for name, transform in TRANSFORMS.items():
        links = "uplink and downlink" if transform.on_downlink else "uplink"
        written = f"a step {{{name}: value}} of federation.{links.replace(' and ', ' or ')}"
        found.append(Entry(f"transforms.{name}", f"transform {name} ({written}: {TRANSFORM_VALUE})",
                           f"{transform.help} ({links})", transform.params, [transform.help], declared=transform))
    found += [axis_entry(axis) for axis in sections()]
    found.append(Entry("capabilities", "capabilities an algorithm may require and a problem provide:",
                       ", ".join(CAPABILITIES), notes=[f"{n}: {meaning}" for n, meaning in CAPABILITIES.items()]))
    formulas = []
    for kind, schedule in KINDS.items():
        fields = ", ".join(f if f in schedule.required() else f"[{f}]" for f in schedule.own_fields())
        formulas.append(f"{kind}: {schedule.formula}  ({fields})")
    found.append(Entry("schedules", "schedules: an algorithm's float hyperparameter also takes one, {schedule: KIND, "
                       "init: ..., ...}: its value at round k after a linear warm-up of `warmup` rounds from "
                       "`warmup_init` (default 0) to init, of H rounds after it (a list in a field is a grid axis; "
                       "[optional]):", "a value per round: " + ", ".join(KINDS), notes=formulas, declared=KINDS))
    return found


def axis_entry(axis: FederationAxis | Section) -> Entry:
    """An axis of the registry `fedbench.axes.registry.AXES` as `fedbench list` shows it: its recipe path, what it is
    and an example, its parameters (a chain's are its transforms', listed apart), what declares it."""
    if isinstance(axis, Section):
        return Entry(axis.path, f"{axis.path}: {axis.example} at a recipe's top level, {axis.detail or axis.what}",
                     f"{axis.example}: {axis.what}", axis.params, declared=axis.declared)
    notes = ["its steps: the transforms below (fedbench list transforms)"] if isinstance(axis, Chain) else []
    summary = f"{axis.what}, e.g. {axis.example}"
    return Entry(axis.path, f"{axis.path}: {summary}", summary, axis.params, notes, declared=axis.declared)


def select(known: list[Entry], name: str) -> list[tuple[Entry, Sequence[Param]]]:
    """The entries NAME names, each with the parameters it names: an entry whose path starts with NAME by whole
    parts (`federation` names `federation.participation` too) or whose own name it is, with all its parameters; an
    entry whose path NAME continues, with its parameters whose names start with the rest
    (`algorithms.fedavg.client` names fedavg's `client_lr`)."""
    chosen = []
    for entry in known:
        if entry.path == name or entry.path.startswith(f"{name}.") or entry.name == name:
            chosen.append((entry, entry.params))
        elif name.startswith(f"{entry.path}."):
            rest = name[len(entry.path) + 1:]
            params = [p for p in entry.params if p.name.startswith(rest)]
            if params:
                chosen.append((entry, params))
    return chosen


def wrapped(text: str, width: int, indent: int = 0, hanging: int = 0) -> list[str]:
    """`text` as lines of at most `width` characters, broken only between words (a word longer than a line stays
    whole), the first indented by `indent`, the others by `indent + hanging`."""
    return textwrap.wrap(text, width, initial_indent=" " * indent, subsequent_indent=" " * (indent + hanging),
                         break_long_words=False, break_on_hyphens=False) or [""]


def param_lines(p: Param, width: int) -> list[str]:
    """A parameter: its name, type, default and valid values on a line, what it is below."""
    head = f"{p.name}: {p.kind}{' (log)' if p.log else ''} = {p.default}; {p.describe_range()}"
    return wrapped(head, width, 2, 4) + wrapped(p.help, width, 6)


def entry_lines(entry: Entry, params: Sequence[Param], width: int) -> list[str]:
    """An entry in full (or with some of its parameters: without its notes)."""
    lines = wrapped(entry.heading, width, 0, 2)
    for p in params:
        lines += param_lines(p, width)
    if list(params) == list(entry.params):
        for note in entry.notes:
            lines += wrapped(note, width, 2, 4)
    return lines


def overview_lines(known: list[Entry], width: int, program: str) -> list[str]:
    """Each section's entries by name with their summaries, and how to ask for one in full."""
    lines = []
    for section in SECTIONS:
        mine = [e for e in known if e.path == section or e.path.startswith(f"{section}.")]
        if section == "algorithms":
            lines += wrapped(f"{section} (* takes uneven local work, {UNEVEN}, with its default hyperparameters)",
                             width, 0, 2)
        elif section == "transforms":
            lines += wrapped(f"{section} (federation.uplink and federation.downlink, lists of steps {{name: value}}, "
                             f"{TRANSFORM_VALUE})", width, 0, 2)
        elif section == "networks":
            lines += wrapped(f"{section} (a problem's model, torch modules; your own as {OWN_NETWORK})", width, 0, 2)
        elif section in ("problems", "federation"):
            lines.append(section)
        names = [e.path if section == "federation" else e.name for e in mine]
        column = min(max(map(len, names)) + 2, 26)
        for entry, name in zip(mine, names):
            if section not in ("problems", "algorithms", "networks", "federation", "transforms"):
                lines += wrapped(f"{name}: {entry.summary}", width, 0, 2)
            else:
                lines += wrapped(f"{name:<{column - 2}}  {entry.summary}", width, 2, column)
    lines += wrapped(f"`{program} list NAME...` prints them in full: a section ({', '.join(SECTIONS)}), a name "
                     "(fedavg, lasso, top_k, participation) or a recipe field's path (federation.local_steps, "
                     "algorithms.fedavg.client_lr).", width)
    return lines


def listing(names: list[str], width: int, program: str) -> tuple[list[str], list[str]]:
    """The lines `fedbench list NAMES` prints, and the NAMES that name nothing."""
    known = entries()
    if not names:
        return overview_lines(known, width, program), []
    lines: list[str] = []
    unknown: list[str] = []
    for name in names:
        chosen = select(known, name)
        if not chosen:
            unknown.append(name)
        for entry, params in chosen:
            lines += ([""] if lines else []) + entry_lines(entry, params, width)
    return lines, unknown


def closest(name: str) -> list[str]:
    """The sections, names and paths nearest to an unknown NAME, for its refusal."""
    known = entries()
    candidates = dict.fromkeys([*SECTIONS, *(e.name for e in known), *(e.path for e in known),
                                *(f"{e.path}.{p.name}" for e in known for p in e.params)])
    return difflib.get_close_matches(name, list(candidates), n=3)
