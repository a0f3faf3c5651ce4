"""The site's reference, written at build time from the code (an MkDocs hook, named in mkdocs.yml).

Every page under `reference/` is generated here, none is kept in docs/: a problem or algorithm registered in
`fedbench.PROBLEMS` / `fedbench.ALGORITHMS`, a `Param` declared on one, a recipe field of
`sweeps/recipe/schema.py` or a CLI option appears on the site at the next `make docs` with no page edited.
What is read, and from where:

- problems: `params` (type, default, range, help), `presets`, the contract lines `fedbench list` prints
  (`contract_lines`: presets, capabilities provided, metrics with direction), each preset's metrics with their
  labels, and the module's docstring (the paper's setting);
- algorithms: `hparams`, `requirements(hp)` at the defaults and for each choice that changes them, the
  minibatches it draws, and the module's docstring (the update rule, with the paper and its equations);
- the recipe: the pydantic models of `SECTIONS` (each field's type, default and constraints; the rule a field
  validator enforces, read from the message it gives a value it refuses; the comment beside the field in the
  source); the federation's parameters and axes as `fedbench list` catalogues them (`sweeps.catalogue.entries`, the
  one catalogue both read): the adversaries and robust rules of `fedbench.axes.robust`, the participation models and
  uneven local steps of `fedbench.axes.participation`, the server optimizer of `fedbench.axes.server_optimizers`, any
  other axis of the registry `fedbench.axes.registry.AXES`, and the transforms of `fedbench.axes.transforms`
  (parameters, help, the module's docstring), and the kinds of schedule; the tune space's distributions and samplers;
- the shipped networks (`fedbench.networks.NETWORKS`): each one's parameter count, input, classes and source;
- the CLI: the Typer app as Click sees it (every command, argument and option with its help and default);
- the gallery's tables of shipped recipes: a page's `<!-- shipped-recipes: PREFIX -->` becomes the table of the
  recipes whose name starts with PREFIX, from their headers (`sweeps/shipped.py`, as `fedbench recipes`);
- the gallery's deviations: a page's `<!-- deviations: PAPER -->` becomes the list of the paper claims fedbench
  does not reproduce, as declared once in `sweeps/deviations.py` (which the paper-size tests check);
- the Python API (`API_PAGES`): a page per topic whose text is the docstrings of the modules, classes, methods and
  attributes it names, rendered by mkdocstrings; a name it shows without a docstring fails the build
  (`undocumented`), since mkdocstrings would leave it out silently.

Only built-in components are documented (plugins are not discovered): `fedbench list` shows a user's own.
The hook adds the pages to the nav itself (`on_config`), so mkdocs.yml names only the reference's index.
"""
from __future__ import annotations

import inspect
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REFERENCE = "reference"
ROOT = Path(__file__).resolve().parents[2]  # the repository, where mkdocs.yml points mkdocstrings (`paths: [.]`)
log = logging.getLogger("mkdocs.hooks.reference")  # a warning fails the strict build

# -- values as a recipe writes them ---------------------------------------------------------------------------


def yaml_value(value: Any) -> str:
    """A default as one would write it in a recipe (YAML): null, true, .inf, [a, b]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def cell(text: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def code(text: Any) -> str:
    return f"`{text}`" if str(text) else ""


def param_table(params, schedules: bool = False) -> list[str]:
    """One row per `fedbench.hparams.Param`: what `fedbench list` prints, as a table; with `schedules`, a float's
    type says that it also takes a schedule (an algorithm's hyperparameters)."""
    if not params:
        return ["No parameters."]
    lines = ["| parameter | type | default | range | description |", "|---|---|---|---|---|"]
    for p in params:
        kind = p.kind + (", log scale" if p.log else "") + (", or null" if p.nullable else "")
        kind += ", or a [schedule](../recipe.md#schedules)" if schedules and p.kind == "float" else ""
        labels = "; display names: " + ", ".join(f"{v} = {n}" for v, n in p.labels) if p.labels else ""
        lines.append(f"| {code(p.name)} | {cell(kind)} | {cell(code(yaml_value(p.default)))} | "
                     f"{cell(p.describe_range())} | {cell(p.help + labels)} |")
    return lines


def module_doc(cls) -> str:
    """The docstring of the module that defines `cls` (where each component states its paper and equations),
    else the class's own, as Markdown (`markdown_lists`)."""
    module = inspect.getmodule(cls)
    return markdown_lists(inspect.cleandoc((module and module.__doc__) or cls.__doc__ or ""))


BULLET = re.compile(r"(\*|-|\d+\.) ")


def markdown_lists(text: str) -> str:
    """A docstring's bullet lists as Markdown lists: Markdown needs a blank line before a list, which docstrings
    leave out (`Server threshold:` then `* bao — ...`): without it the items ran into the paragraph above."""
    lines: list[str] = []
    for line in text.splitlines():
        above = lines[-1] if lines else ""
        if BULLET.match(line) and above.strip() and not BULLET.match(above) and not above.startswith(" "):
            lines.append("")
        lines.append(line)
    return "\n".join(lines)


def source_path(cls) -> str:
    module = cls.__module__
    return module.replace(".", "/") + ".py" if module.startswith("fedbench.") else module


# -- problems ---------------------------------------------------------------------------------------------------


def problem_page(name: str, cls) -> str:
    from fedbench_sweeps.catalogue import contract_lines

    lines = [f"# Problem `{name}`", "", f"Source: `{source_path(cls)}`. In a recipe: `problem: {{name: {name}, ...}}`.",
             "", "## What it is", "", module_doc(cls), "", "## Parameters", "",
             "Set any of these under `problem:` in a recipe, or with `--set problem.NAME=VALUE`.", "",
             *param_table(cls.params), ""]
    if cls.presets:
        default = cls.resolve_config({}).get("preset")
        lines += ["## Presets", "", "`preset:` chooses a set of values; fields given beside it override it.", "",
                  "| preset | values it sets |", "|---|---|"]
        for preset, values in cls.presets.items():
            mark = " (default)" if preset == default else ""
            lines.append(f"| {code(preset)}{mark} | {cell(code(yaml_value(values)) if values else '—')} |")
        lines.append("")
    lines += ["## Contract", "", "As `fedbench list` prints it (with the default configuration):", "", "```text",
              *contract_lines("problem", cls), "```", "", "## Metrics", ""]
    lines += metric_tables(cls)
    return "\n".join(lines) + "\n"


def metric_tables(cls) -> list[str]:
    """The metrics of each preset's configuration (one table where every preset gives the same)."""
    configs = {preset: cls.resolve_config({"preset": preset}) for preset in cls.presets} or {"": cls.resolve_config({})}
    tables: dict[tuple, list[str]] = {}
    for preset, config in configs.items():
        key = tuple((m.name, m.label, m.direction) for m in cls.declared_metrics(config, personal=True))
        tables.setdefault(key, []).append(preset)
    lines = []
    for key, presets in tables.items():
        if len(tables) > 1:
            lines += [f"With preset {', '.join(map(code, presets))}:", ""]
        lines += ["| metric | label | better |", "|---|---|---|"]
        lines += [f"| {code(n)} | {cell(label)} | {direction or '—'} |" for n, label, direction in key]
        lines.append("")
    lines.append("`personal_*` metrics are reported with a personalized algorithm only. Every row also has the "
                 "engine's columns (`round`, `comm_up`, `comm_down`, `iterations`, ...).")
    return lines


# -- algorithms -------------------------------------------------------------------------------------------------


def algorithm_page(name: str, cls) -> str:
    from fedbench.hparams import resolve
    from fedbench.problems import PROBLEMS
    from fedbench_sweeps.catalogue import contract_lines

    title = cls.title or name
    lines = [f"# Algorithm `{name}`" + (f": {title}" if title != name else ""), "",
             f"Source: `{source_path(cls)}`. In a recipe: `algorithms: {{{name}: {{...}}}}`.", "",
             "## Update rule", "", module_doc(cls), "", "## Hyperparameters", "",
             f"Set under `algorithms.{name}` (a list is a grid axis; a float also takes a "
             f"[schedule](../recipe.md#schedules), a value per round), with `--set algorithms.{name}.NAME=VALUE`, "
             "or searched by a `tune:` block.", "", *param_table(cls.hparams, schedules=True), "",
             "## What it requires", "",
             "As `fedbench list` prints it:", "", "```text", *contract_lines("algorithm", cls), "```", ""]
    defaults = resolve(cls.hparams, {}, name)
    base = cls.requirements(defaults)
    changes = []
    for p in cls.hparams:
        for value in (p.choices if p.kind == "choice" else (True, False) if p.kind == "bool" else ()):
            if value == defaults[p.name]:
                continue
            other = cls.requirements({**defaults, p.name: value})
            if other != base:
                added, dropped = sorted(other - base), sorted(base - other)
                change = ", ".join([f"also {c}" for c in added] + [f"not {c}" for c in dropped])
                changes.append(f"- with `{p.name}: {yaml_value(value)}`: {change}")
    if changes:
        lines += ["Other values change that:", "", *changes, ""]
    batches = cls.minibatches(defaults)
    lines += ["Minibatches each local step draws: " + ", ".join(
        f"`{b.name}`" + (f" (size `{b.size}`)" if b.size is not None else " (the federation's `batch_size`)")
        + (f", the draw of `{b.same_as}`" if b.same_as else "") for b in batches) + ".", ""]
    runs_on = [problem for problem, pcls in PROBLEMS.items()
               if any(base <= pcls.capabilities(pcls.resolve_config({"preset": preset} if preset else {}))
                      for preset in (pcls.presets or [None]))]
    lines += ["Problems that provide all of it with their defaults or a preset: "
              + (", ".join(f"[`{p}`](../problems/{p}.md)" for p in runs_on) or "none of the built-in ones") + ".", ""]
    if cls.personalized and cls.personal_optional:
        lines += ["Personal models where the problem evaluates them: each client keeps its own model, and the problem "
                  "reports `personal_*` metrics; elsewhere it runs as a global method.", ""]
    elif cls.personalized:
        lines += ["Personalized: each client keeps its own model, and the problem reports `personal_*` metrics.", ""]
    return "\n".join(lines) + "\n"


# -- the recipe -------------------------------------------------------------------------------------------------


def type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    text = text or str(annotation)
    return re.sub(r"\b(typing|fedbench_sweeps\.recipe\.schema|sweeps\.recipe\.schema)\.", "", text).replace(
        "NoneType", "None")


def field_comments(model) -> dict[str, str]:
    """The comment written beside each field in the model's source (on its line, or on the lines just above)."""
    comments: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(model).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        match = re.match(r"\s+(\w+):[^#]*?(?:#\s*(.*))?$", line)
        if match and not stripped.startswith(("def ", "@", "return", "if ", "raise ")):
            comments[match.group(1)] = " ".join(above + ([match.group(2)] if match.group(2) else []))
        above = []
    return comments


REFUSED_PROBES = ("\u2205", 1.5, [""], -1)  # values a validator is shown, to read the rule from its refusal


def validator_rule(model, field: str) -> str:
    """What a field validator expects, in its own words: the 'expected ...' of the message it refuses a value
    with (pydantic type errors, which say nothing of the rule, are skipped)."""
    from pydantic import ValidationError

    validators = model.__pydantic_decorators__.field_validators.values()
    if not any(field in v.info.fields for v in validators):
        return ""
    for probe in REFUSED_PROBES:
        try:
            model.model_validate({field: probe})
        except ValidationError as err:
            for error in err.errors():
                if error["loc"][:1] == (field,) and error["type"] == "value_error":
                    message = error["msg"].removeprefix("Value error, ")
                    return message[message.index("expected"):] if "expected" in message else message
    return ""


def constraints(model, name: str, field) -> str:
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "length >=", "max_length": "length <="}
    rules = [f"{words[attr]} {getattr(m, attr)}" for m in field.metadata for attr in words
             if getattr(m, attr, None) is not None]
    rule = validator_rule(model, name)
    return "; ".join(rules + ([rule] if rule else []))


def field_default(field) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if hasattr(value, "model_dump"):
        return "the block's defaults"
    return code(yaml_value(value))


def recipe_page() -> str:
    from fedbench_sweeps.catalogue import entries
    from fedbench_sweeps.recipe.schema import DISTRIBUTIONS, SAMPLERS, SECTIONS

    listed = {entry.path: entry for entry in entries()}  # `fedbench list`'s catalogue, which this page follows

    lines = ["# Recipe schema", "",
             "A recipe is a YAML file (read with `safe_load`; unknown fields are refused with the closest name). "
             "The tables below are generated from the pydantic models in `sweeps/recipe/schema.py` and the "
             "engine's declarations; a field's constraint is the rule it is validated by.", ""]
    for path, model in SECTIONS.items():
        heading = "Top level" if not path else "`" + ".".join(path) + ":`"
        lines += [f"## {heading}", ""]
        if model.__doc__ and path:
            lines += [inspect.cleandoc(model.__doc__), ""]
        comments = field_comments(model)
        lines += ["| field | type | default | constraint | description |", "|---|---|---|---|---|"]
        for name, field in model.model_fields.items():
            lines.append(f"| {code(name)} | {cell(code(type_name(field.annotation)))} | {cell(field_default(field))} "
                         f"| {cell(constraints(model, name, field))} | {cell(comments.get(name, ''))} |")
        lines.append("")
        if not path:
            lines += ["- `problem`: `name` (see [problems](index.md#problems)), an optional `preset`, and any of "
                      "that problem's parameters; a list is a grid axis.",
                      "- `algorithms`: each algorithm's name (see [algorithms](index.md#algorithms)) mapped to its "
                      "hyperparameters (a list is a grid axis), or to nothing for the defaults; an entry may also "
                      "hold its own `problem:` and `federation:` overrides.", ""]
    lines += ["## `federation:`", "", "How rounds run; a list is a grid axis (generated from `FEDERATION_PARAMS`).",
              "", *param_table(listed["federation"].params), "", *axes_section(listed), *federation_sections(listed),
              "## `tune.space` distributions", "",
              "Each entry of `tune.space` maps a parameter (bare name, `problem.X`, `federation.X` or "
              "`algorithms.ALGO.X`; or a field of the schedule a hyperparameter follows, `X.FIELD` or "
              "`algorithms.ALGO.X.FIELD`) to one distribution: " + ", ".join(map(code, DISTRIBUTIONS)) +
              ", e.g. `client_lr: {log_uniform: [1.0e-5, 1.0e-1]}` or `client_lr.init: {log_uniform: [1.0e-4, "
              "1.0e-1]}`. `tune.sampler` is one of " + ", ".join(map(code, SAMPLERS)) + ".", "",
              *schedules_section(listed["schedules"])]
    return "\n".join(lines) + "\n"


def federation_sections(listed: dict) -> list[str]:
    """A section per axis of the federation that `fedbench list` catalogues (`listed`, by path), in the order of the
    registry `fedbench.axes.registry.AXES` but for the links' chains, last with their transforms: the adversaries,
    participation with uneven local steps, the server optimizer, any other mapping (`mapping_section`)."""
    from fedbench.axes.registry import AXES, Chain

    written = {"federation.adversaries": robust_section, "federation.participation": participation_section,
               "federation.server_optimizer": server_optimizer_section}
    beside = ("federation.local_steps",)  # with participation
    chains = [f"federation.{key}" for key, axis in AXES.items() if isinstance(axis, Chain)]
    lines = []
    for path, entry in listed.items():
        if path.startswith("federation.") and path not in (*beside, *chains):
            lines += written[path](listed) if path in written else mapping_section(entry)
    return lines + transforms_section([entry for path, entry in listed.items() if path.startswith("transforms.")])


def axes_section(listed: dict) -> list[str]:
    """Every axis of the registry `fedbench.axes.registry.AXES` in one table: where a recipe sets it, what it is with an
    example (its summary in `fedbench list`, `listed` by path)."""
    from fedbench.axes.registry import AXES

    lines = ["## Axes", "", "Every axis of a run, as the registry `fedbench.axes.registry.AXES` declares it and "
             "`fedbench list` shows it: its field in a recipe (under `federation:`, or at the top level), what it "
             "is with an example; each is described on this page (the top-level ones in the tables above, the "
             "federation's below).", "",
             "| field | what it is |", "|---|---|"]
    for axis in AXES.values():
        lines.append(f"| {code(axis.path)} | {cell(listed[axis.path].summary)} |")
    return [*lines, ""]


def mapping_section(entry) -> list[str]:
    """A mapping of the federation's without a section written for it: its line in `fedbench list`, its fields,
    then the docstring of the module that declares it."""
    return [f"## `{entry.path}`", "", f"{entry.heading}; each field a grid axis where it is a list.", "",
            *param_table(entry.params), "", module_doc(entry.declared), ""]


def robust_section(listed: dict) -> list[str]:
    """`federation.aggregation`'s robust rules and `federation.adversaries`: the adversaries' parameters, then the
    module's docstring (each rule's and attack's paper, how the engine applies them)."""
    adversaries = listed["federation.adversaries"]
    return ["## Robust aggregation and `federation.adversaries`", "",
            "`aggregation: median | trimmed_mean | krum | multi_krum` puts a robust rule in place of the server's mean "
            "(with `trim` β and `byzantine` f above); `adversaries` is a mapping of the parameters below (generated "
            "from `fedbench.axes.robust.Adversaries`), each a grid axis where it is a list, e.g. "
            "`adversaries: {fraction: [0.1, 0.3], attack: sign_flip, scale: 10}` or "
            "`--set federation.adversaries.attack=[sign_flip,gaussian]`.", "",
            *param_table(adversaries.params), "", module_doc(adversaries.declared), ""]


def participation_section(listed: dict) -> list[str]:
    """`federation.participation` and uneven `federation.local_steps`: the fields of each mapping, then the module's
    docstring (each model's draws and paper, how the engine runs a varying number of participants and uneven work)."""
    participation, local_steps = listed["federation.participation"], listed["federation.local_steps"]
    return ["## `federation.participation` and uneven `federation.local_steps`", "",
            "`participation` is a mapping of the fields below (generated from "
            "`fedbench.axes.participation.Participation`), "
            "only those its `model` reads, each a grid axis where it is a list, e.g. "
            "`participation: {model: bernoulli, p: [0.1, 0.5]}` or `--set federation.participation.p=[0.1,0.5]`; a "
            "list of such mappings is a grid axis over them; `tune.space` searches a field the model reads, "
            "`federation.participation.p: {uniform: [0.05, 0.5]}`.", "",
            *param_table(participation.params), "",
            "`local_steps` may be a mapping in place of E, uneven local work: `{distribution: uniform, low: 1, high: "
            "10}`, `{counts: [...]}` (one per client) or `{file: steps.npy}` (generated from "
            "`fedbench.axes.participation.LocalSteps`); `--set federation.local_steps.high=[5,10]` is a grid axis "
            "inside, "
            "`local_steps: [10, {distribution: uniform, low: 1, high: 10}]` one of E beside uneven work, and "
            "`tune.space` searches `federation.local_steps.low` or `.high` of a drawn count.",
            "", *param_table(local_steps.params), "", module_doc(participation.declared), ""]


def server_optimizer_section(listed: dict) -> list[str]:
    """`federation.server_optimizer`: its fields, then the module's docstring (each rule's formulas, its two forms,
    where the engine applies it, which algorithms take it)."""
    server_optimizer = listed["federation.server_optimizer"]
    return ["## `federation.server_optimizer`", "",
            "`server_optimizer` is a mapping of the fields below (generated from "
            "`fedbench.axes.server_optimizers.ServerOptimizer`), only those its `name` reads, each a grid axis where "
            "it is "
            "a list, e.g. `server_optimizer: {name: adam, lr: [0.01, 0.1]}` or "
            "`--set federation.server_optimizer.lr=[0.01,0.1]`; a list of such mappings is a grid axis over rules "
            "(`[{name: sgd}, {name: yogi}]`: `sgd` at lr 1 is the algorithm's own server step); the lr may be a "
            "schedule (`lr: {schedule: cosine, init: 0.03, final: 1.0e-3}`, see schedules below); `tune.space` "
            "searches a field the rule reads, `federation.server_optimizer.lr: {log_uniform: [1.0e-3, 1.0e-1]}`.", "",
            *param_table(server_optimizer.params), "", module_doc(server_optimizer.declared), ""]


def transforms_section(transforms: list) -> list[str]:
    """`federation.uplink` and `federation.downlink`: the transforms (`fedbench list`'s entries of
    `fedbench.axes.transforms.TRANSFORMS`), each with its parameters, then the module's docstring (what a chain does,
    each transform's paper, its encoding in bits)."""
    lines = ["## `federation.uplink` and `federation.downlink`", "",
             "Lists of transforms of each client's uploads and of the server's broadcast (generated from "
             "`fedbench.axes.transforms.TRANSFORMS`). An entry is a transform's name (its defaults), `{name: value}` "
             "(its "
             "first parameter) or `{name: {parameter: value}}`; a list as a parameter's value is a grid axis, e.g. "
             "`uplink: [{top_k: [0.01, 0.05]}, {error_feedback: ef21}]`, or "
             "`--set federation.uplink.0.top_k=[0.01,0.05,0.1]`; a list of such lists is a grid axis over chains "
             "(`[[], [{top_k: 0.01}]]`: none, then top-k), and `tune.space` searches a step's parameter as "
             "`federation.uplink.0.top_k`. Every row then has `comm_up_bits` and "
             "`comm_down_bits`, which `report.x` can draw against.", "",
             "| transform | on | parameters | what it does; what a message of d values of b bits costs |",
             "|---|---|---|---|"]
    for entry in transforms:
        name, transform = entry.name, entry.declared
        params = "; ".join(f"`{p.name}` ({p.kind} in {p.describe_range()}, default {code(yaml_value(p.default))}): "
                           f"{p.help}" for p in transform.params) or "none"
        links = "uplink, downlink" if transform.on_downlink else "uplink"
        lines.append(f"| {code(name)} | {links} | {cell(params)} | {cell(transform.help)} |")
    top_k = next(entry.declared for entry in transforms if entry.name == "top_k")  # of fedbench.axes.transforms
    return [*lines, "", module_doc(top_k), ""]


def schedules_section(schedules) -> list[str]:
    """The kinds of schedule a float hyperparameter takes (`fedbench list`'s entry `schedules`) and their fields
    (`fedbench.schedules`)."""
    from fedbench.schedules import FIELDS, VALUES

    lines = ["## Schedules", "",
             "An algorithm's float hyperparameter takes a schedule instead of a number, "
             "`{schedule: KIND, init: ..., ...}` (a list in a field is a grid axis): its value at round r "
             "(from 0) of T rounds, after a linear warm-up of W = `warmup` rounds from `warmup_init` to `init`, "
             "is the kind's formula at k = r − W, with H = max(T − W, 1) (generated from `fedbench/schedules.py`; "
             "[the recipe guide](../guide/recipes.md#schedules) has examples).", "",
             "| `schedule:` | value | fields (required in bold) |", "|---|---|---|"]
    for kind, cls in schedules.declared.items():
        fields = ", ".join(f"**`{f}`**" if f in cls.required() else code(f) for f in cls.own_fields())
        lines.append(f"| {code(kind)} | {cell(cls.formula)} | {fields} |")
    lines += ["", "| field | type | default | range | description |", "|---|---|---|---|---|"]
    for name, p in FIELDS.items():
        value_range = ("the hyperparameter's" + (" (from its lower end)" if name == "warmup_init" else "")
                       if name in VALUES else p.describe_range())
        default = "required" if p.default is None else code(yaml_value(p.default))
        lines.append(f"| {code(name)} | {p.kind} | {default} | {cell(value_range)} | {cell(p.help)} |")
    return lines + [""]


# -- the CLI ----------------------------------------------------------------------------------------------------


def cli_commands():
    """The Click group of the Typer app, and its commands by name."""
    import typer.main

    from fedbench_sweeps.cli import app

    group = typer.main.get_command(app)
    return group, dict(group.commands)


def option_rows(command, context) -> list[str]:
    rows = ["| argument or option | type | default | description |", "|---|---|---|---|"]
    for param in command.params:
        if param.param_type_name == "argument":
            name = code(getattr(param, "metavar", None) or param.name.upper())
        else:
            name = ", ".join(code(o) for o in [*param.opts, *param.secondary_opts])
        kind = "flag" if getattr(param, "is_flag", False) else param.display_type(context).strip("<>")
        if param.multiple:
            kind += ", repeatable"
        default = ("required" if param.required else "" if param.default in (None, (), [])
                   else code(yaml_value(param.default)))
        help_text = getattr(param, "help", "") or ""
        if getattr(param, "envvar", None):
            help_text += f" (environment: `{param.envvar}`)"
        rows.append(f"| {name} | {cell(kind)} | {cell(default)} | {cell(help_text)} |")
    return rows if len(rows) > 2 else ["No arguments or options."]


def cli_page() -> str:
    group, commands = cli_commands()
    lines = ["# Command line", "", "Generated from the Typer app (`sweeps/cli.py`). `fedbench --help` and "
             "`fedbench COMMAND --help` print the same.", "", "## `fedbench`", "", inspect.cleandoc(group.help or ""),
             "", *option_rows(group, _context(group)), ""]
    for name, command in commands.items():
        context = _context(group, command)
        usage = " ".join(command.collect_usage_pieces(context))
        lines += [f"## `fedbench {name}`", "", f"`fedbench {name} {usage}`", "", inspect.cleandoc(command.help or ""),
                  "", *option_rows(command, context), ""]
    return "\n".join(lines) + "\n"


def _context(group, command=None):
    """A Click context for the command (Typer's own Click, whichever it bundles: the command's context class)."""
    parent = group.context_class(group, info_name="fedbench")
    return parent if command is None else command.context_class(command, parent=parent, info_name=command.name)


# -- the Python API ---------------------------------------------------------------------------------------------

EVERY = None  # an object's members on its page: every public one (no leading underscore)
INHERITED = "inherited"  # every public one, those it inherits from its bases in the package too (`Algorithm`'s)


@dataclass(frozen=True)
class ApiPage:
    """One page of the Python API: its title, what it covers (the index's table), the module whose docstring opens
    it, and the objects it documents in order (dotted paths), each with the members it shows: `EVERY` public member
    of a class (`INHERITED`: with those of its bases), or those named (none: `()`, for a dataclass whose docstring
    says its fields)."""
    title: str
    summary: str
    module: str
    objects: dict[str, tuple[str, ...] | str | None]


BASE = "fedbench.algorithms.base"
API_PAGES = {
    "algorithm": ApiPage(
        "Algorithm interface", "`Algorithm` and its hooks, with the shapes they take and give; `Round`, `Upload`, "
        "the hyperparameters `hp` and the helpers of a round's maths", BASE,
        {f"{BASE}.Algorithm": INHERITED, f"{BASE}.Round": EVERY, "fedbench.hparams.HParams": (), f"{BASE}.Upload": (),
         f"{BASE}.Routing": (), f"{BASE}.MODEL": (), f"{BASE}.State": (), f"{BASE}.CLIENT_LR": (),
         f"{BASE}.SERVER_LR": (), f"{BASE}.H_MODE": (), f"{BASE}.broadcast": (), f"{BASE}.aggregate": (),
         f"{BASE}.composite_step": (), f"{BASE}.coin_flips_to_success": (), f"{BASE}.per_client_copies": (),
         f"{BASE}.upload_floats": (), f"{BASE}.ScheduleError": (), f"{BASE}.MessageError": ()}),
    "problem": ApiPage(
        "Problem interface", "`Problem`: the seven names a problem writes (`gather`, the loss, metrics, ...) and the "
        "defaults of the rest; `ProblemSpec`, what is read before building (parameters, capabilities (`provides`), "
        "config hooks); its clients' rows and minibatch draws, its full-data oracles; `Layout`",
        "fedbench.problems.base",
        {"fedbench.problems.base.CONTRACT": (), "fedbench.problems.base.Problem": EVERY,
         "fedbench.problems.spec.ProblemSpec": EVERY, "fedbench.problems.spec.Layout": (),
         "fedbench.problems.sampling.ClientRows": ("num_clients", "client_sizes", "client_offsets", "client_sizes_cpu",
                                                   "client_offsets_cpu", "max_size", "equal_sizes", "draw_minibatches",
                                                   "draw_epochs"),
         "fedbench.problems.full_data.FullDataOracles": ("full_data", "client_loss", "client_grad",
                                                         "client_loss_and_grad", "client_hvp")}),
    "oracles": ApiPage(
        "Oracles", "what a local step's `batches` hold: `Oracle` (`loss`, `grad`, `hvp`), `Batches`, `Minibatch`, "
        "and the lifting of full-data oracles over runs", "fedbench.oracle",
        {"fedbench.oracle.Oracle": EVERY, "fedbench.oracle.Batches": (), "fedbench.oracle.Minibatch": (),
         "fedbench.oracle.RunAxisOracle": EVERY, "fedbench.oracle.over_runs": ()}),
    "parameters": ApiPage(
        "Parameters and metrics", "`Param` (type, default, range, help), `Metric` (label, direction) and the "
        "errors a declaration or a value gets", "fedbench.hparams",
        {"fedbench.hparams.Param": EVERY, "fedbench.hparams.KINDS": (), "fedbench.hparams.ParamError": (),
         "fedbench.hparams.resolve": (), "fedbench.metrics.Metric": EVERY, "fedbench.contract.CAPABILITIES": (),
         "fedbench.contract.IncompatibleError": ()}),
    "schedules": ApiPage(
        "Schedules", "a float hyperparameter's value per round: `Cosine`, `Step`, `Exponential`, `InverseSqrt`, "
        "`Constant`, each with a linear warm-up, and the `PerRound` interface the engine evaluates",
        "fedbench.schedules",
        {"fedbench.schedules.Schedule": ("value", "decay", "as_config", "own_fields", "required", "checked",
                                         "check_field", "field_param"),
         "fedbench.schedules.Constant": (), "fedbench.schedules.Step": (), "fedbench.schedules.Exponential": (),
         "fedbench.schedules.InverseSqrt": (), "fedbench.schedules.Cosine": (), "fedbench.schedules.KINDS": (),
         "fedbench.schedules.FIELDS": (), "fedbench.schedules.VALUES": (), "fedbench.schedules.make": (),
         "fedbench.schedules.kind_of": (), "fedbench.schedules.BadField": (), "fedbench.hparams.PerRound": EVERY}),
    "running": ApiPage(
        "Running", "`fedbench.run`, `make_problem`, `make_algorithm`, `simulate`, runs of several seeds as one "
        "program, `Result`, `Federation`, `Simulation` and the run's record it holds (`RunRecord`), saved models",
        "fedbench",
        {"fedbench.run": (), "fedbench.problems.make_problem": (), "fedbench.make_algorithm": (),
         "fedbench.engine.simulate.simulate": (), "fedbench.engine.simulate.run_seeds": (),
         "fedbench.engine.simulate.run_batch": (),
         "fedbench.engine.simulate.Result": EVERY, "fedbench.engine.federation.Federation": ("check",),
         "fedbench.engine.simulate.Simulation": ("run_round",),
         "fedbench.engine.record.RunRecord": ("server", "clients", "status", "rounds_done", "seed", "accountant",
                                              "streams", "state_dict", "load_state_dict"),
         "fedbench.engine.saved.load_model": (), "fedbench.engine.saved.problem_of": (),
         "fedbench.algorithms.ALGORITHMS": (),
         "fedbench.problems.PROBLEMS": ()}),
    "privacy": ApiPage(
        "Privacy accounting", "ε of DP-FedAvg's Gaussian uplink at a δ: the mechanism the engine runs (sampling, "
        "adjacency, sensitivity) and dp-accounting's accountants (PLD by default, RDP)", "fedbench.axes.privacy",
        {"fedbench.axes.privacy.Accountant": ("epsilon",),
         "fedbench.axes.privacy.Mechanism": ("of", "noise_multiplier", "event"),
         "fedbench.axes.privacy.check": (), "fedbench.axes.privacy.check_accounted": (),
         "fedbench.metrics.epsilon_metric": ()}),
    "participation": ApiPage(
        "Participation and uneven local work", "who takes part in a round (`Participation`: uniform, cyclic, "
        "bernoulli, markov) and each participant's local steps (`LocalSteps`), how the engine batches them, and "
        "what lets an algorithm take them (its dry round, `fedbench.engine.dry_round.takes_uneven_steps`; "
        "`rnd.client_steps`)",
        "fedbench.axes.participation",
        {"fedbench.axes.participation.Participation": ("varying", "check"),
         "fedbench.axes.participation.LocalSteps": ("check",),
         "fedbench.axes.participation.check_participation": (), "fedbench.axes.participation.check_local_steps": (),
         "fedbench.axes.participation.sample_clients": (), "fedbench.engine.dry_round.takes_uneven_steps": ()}),
    "server_optimizers": ApiPage(
        "Server optimizer", "the server's step on the round's mean update of `w`, for any algorithm that uploads one "
        "(`ServerOptimizer`: sgd, momentum, adagrad, adam, yogi, Reddi et al.'s form or optax's), how the engine "
        "applies it, and the rule of which algorithms take it", "fedbench.axes.server_optimizers",
        {"fedbench.axes.server_optimizers.ServerOptimizer": ("values", "check"),
         "fedbench.axes.server_optimizers.check_algorithm": (),
         "fedbench.axes.server_optimizers.check_server_optimizer": (),
         "fedbench.axes.server_optimizers.updates_of_w": (),
         "fedbench.engine.server_steps.ServerSteps": ("step", "commit")}),
    "transforms": ApiPage(
        "Round transforms", "the uplink and downlink chains: `Transform` (parameters, `apply`, `bits`), the "
        "registry, a chain's steps, how one is read and checked, the bits of a message", "fedbench.axes.transforms",
        {"fedbench.axes.transforms.Transform": EVERY, "fedbench.axes.transforms.Compressor": ("compress",),
         "fedbench.axes.transforms.Step": (),
         "fedbench.axes.transforms.TRANSFORMS": (), "fedbench.axes.transforms.chain": (),
         "fedbench.axes.transforms.check_chain": (),
         "fedbench.axes.transforms.compiled": (), "fedbench.axes.transforms.message_bits": ()}),
    "partitions": ApiPage(
        "Partitions", "splits of a pooled data set over clients: `split` (iid, Dirichlet label skew, label quantity "
        "#C = k, shards), `Partition` with the string a run records, `fingerprint`", "fedbench.data.partitions",
        {"fedbench.data.partitions.split": (), "fedbench.data.partitions.Partition": ("describe", "digest", "split"),
         "fedbench.data.partitions.fingerprint": (), "fedbench.data.partitions.SCHEMES": ()}),
    "images": ApiPage(
        "Image data sets", "Fashion-MNIST and CIFAR-10 as NCHW tensors (`load`, `ImageTensors`, `normalize`) and "
        "CIFAR's crop-and-flip batched over clients", "fedbench.data.images",
        {"fedbench.data.images.load": (), "fedbench.data.images.ImageTensors": (), "fedbench.data.images.normalize": (),
         "fedbench.data.images.random_crop_flip": (), "fedbench.data.images.crop_flip_draws": (),
         "fedbench.data.images.crop_flip": ()}),
    "networks": ApiPage(
        "Networks", "torch modules as models: the shipped networks, loading your own from a file or a module, and the "
        "check that refuses BatchNorm's running statistics", "fedbench.networks",
        {"fedbench.networks.NETWORKS": (), "fedbench.networks.Shipped": ("build",),
         "fedbench.networks.load_network": (), "fedbench.networks.network_class": (),
         "fedbench.networks.check_module": (), "fedbench.networks.parameter_count": ()}),
    "plugins": ApiPage(
        "Plugin loader", "registering your own algorithms and problems from a file, a module or an installed "
        "package's entry points", "fedbench.plugins",
        {"fedbench.plugins.load": (), "fedbench.plugins.discover": (), "fedbench.plugins.register": (),
         "fedbench.plugins.ensure": (), "fedbench.plugins.origin": (), "fedbench.plugins.sources": (),
         "fedbench.plugins.broken": (), "fedbench.plugins.Source": (), "fedbench.plugins.PluginError": (),
         "fedbench.plugins.GROUPS": (), "fedbench.plugins.REQUIRED": (), "fedbench.plugins.ORIGINS": ()}),
}


def api_page(page: ApiPage) -> str:
    """The page's Markdown: its title, the module's docstring, then an mkdocstrings block per object."""
    lines = [f"# {page.title}", "", f"::: {page.module}", "    options:", "      members: false",
             "      show_root_heading: false", "      show_root_toc_entry: false", ""]
    for path, members in page.objects.items():
        lines.append(f"::: {path}")
        if members == INHERITED:
            lines += ["    options:", "      inherited_members: true"]
        elif members is not EVERY:
            lines += ["    options:", f"      members: {list(members) if members else 'false'}"]
        lines.append("")
    return "\n".join(lines)


def load_api():
    """The `fedbench` package as mkdocstrings reads it: griffe's static view of the repository's sources."""
    import griffe

    return griffe.load("fedbench", search_paths=[str(ROOT)])


def documented(page: ApiPage, package) -> list:
    """The griffe objects `page` shows: its module, each object, and each object's members as the page lists them
    (`EVERY` public one: without a leading underscore, defined in the class itself; `INHERITED`, or in its bases)."""
    def find(path: str):
        return package if path == package.path else package[path.removeprefix(package.path + ".")]

    shown = [find(page.module)]
    for path, members in page.objects.items():
        obj = find(path)
        shown.append(obj)
        if members is EVERY:
            shown += [m for name, m in obj.members.items() if not name.startswith("_") and not m.is_alias]
        elif members == INHERITED:
            shown += [m for name, m in obj.all_members.items() if not name.startswith("_")]
        else:
            shown += [obj.members[name] for name in members]
    return shown


def undocumented(objects) -> list[str]:
    """The paths of the objects without a docstring (or with an empty one)."""
    return [obj.path for obj in objects if not (obj.docstring and obj.docstring.value.strip())]


# -- the index and the site -------------------------------------------------------------------------------------


def first_line(cls) -> str:
    text = module_doc(cls)
    return text.split("\n\n")[0].replace("\n", " ") if text else ""


def index_page() -> str:
    from fedbench.algorithms import ALGORITHMS
    from fedbench.contract import CAPABILITIES
    from fedbench.networks import NETWORKS
    from fedbench.problems import PROBLEMS

    lines = ["# Reference", "", "Generated from the code at build time: every page here follows the declarations "
             "(`Param`s, presets, capabilities, metrics, docstrings, the recipe's models, the CLI). "
             "See also the [recipe schema](recipe.md) and the [command line](cli.md).", "", "## Problems", "",
             "| problem | what it is |", "|---|---|"]
    lines += [f"| [`{n}`](problems/{n}.md) | {cell(first_line(c))} |" for n, c in PROBLEMS.items()]
    lines += ["", "## Algorithms", "", "| algorithm | what it is |", "|---|---|"]
    lines += [f"| [`{n}`](algorithms/{n}.md) | {cell(first_line(c))} |" for n, c in ALGORITHMS.items()]
    lines += ["", "## Networks", "", "The torch modules shipped as models (`fedbench.networks.NETWORKS`; "
              "[the guide](../guide/networks.md) says how each was checked against its source and why a module with "
              "BatchNorm is refused), each with the input and classes of the setting its source defines it for; "
              "`fedbench list networks` prints the same.", "",
              "| network | parameters | input | classes | source |", "|---|---|---|---|---|"]
    lines += [f"| {code(n)} | {s.parameters:,} | {'×'.join(map(str, s.input_shape))} | {s.classes} | {cell(s.source)} |"
              for n, s in NETWORKS.items()]
    lines += ["", "## Capabilities", "", "What an algorithm may require and a problem provide "
              "(`fedbench.contract.CAPABILITIES`); an impossible pairing is refused before anything runs.", "",
              "| capability | meaning |", "|---|---|"]
    lines += [f"| {code(n)} | {cell(m)} |" for n, m in CAPABILITIES.items()]
    lines += ["", "## Python API", "", "The interfaces your own algorithms and problems are written against, and "
              "running from Python, generated from the docstrings.", "", "| page | what it documents |", "|---|---|"]
    lines += [f"| [{page.title}](api/{slug}.md) | {cell(page.summary)} |" for slug, page in API_PAGES.items()]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Every generated page, by its path under docs/."""
    from fedbench.algorithms import ALGORITHMS
    from fedbench.problems import PROBLEMS

    out = {f"{REFERENCE}/index.md": index_page(), f"{REFERENCE}/recipe.md": recipe_page(),
           f"{REFERENCE}/cli.md": cli_page()}
    out.update({f"{REFERENCE}/problems/{n}.md": problem_page(n, c) for n, c in PROBLEMS.items()})
    out.update({f"{REFERENCE}/algorithms/{n}.md": algorithm_page(n, c) for n, c in ALGORITHMS.items()})
    out.update({f"{REFERENCE}/api/{slug}.md": api_page(page) for slug, page in API_PAGES.items()})
    return out


def reference_nav() -> list:
    from fedbench.algorithms import ALGORITHMS
    from fedbench.problems import PROBLEMS

    return [f"{REFERENCE}/index.md", {"Recipe schema": f"{REFERENCE}/recipe.md"},
            {"Command line": f"{REFERENCE}/cli.md"},
            {"Problems": [{n: f"{REFERENCE}/problems/{n}.md"} for n in PROBLEMS]},
            {"Algorithms": [{n: f"{REFERENCE}/algorithms/{n}.md"} for n in ALGORITHMS]},
            {"Python API": [{page.title: f"{REFERENCE}/api/{slug}.md"} for slug, page in API_PAGES.items()]}]


def on_config(config):
    """Put the generated pages in place of the nav's `Reference` entry."""
    for i, entry in enumerate(config["nav"] or []):
        if isinstance(entry, dict) and "Reference" in entry:
            config["nav"][i] = {"Reference": reference_nav()}
    return config


def on_files(files: Files, config) -> Files:
    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    package = load_api()
    for slug, page in API_PAGES.items():
        for path in undocumented(documented(page, package)):
            log.warning(f"reference/api/{slug}.md: {path} has no docstring (mkdocstrings would leave it out)")
    return files


# -- the gallery's recipe tables --------------------------------------------------------------------------------

RECIPES_MARKER = re.compile(r"<!-- shipped-recipes: (\S+) -->")


def recipes_table(prefix: str) -> str:
    """The shipped recipes whose name starts with `prefix`, as `fedbench recipes` describes them: what each
    reproduces (its header), its runs (configurations × seeds, from the parsed recipe), its time on 2 cores and on
    one GPU where the header gives one (bench/gallery.py measures them; `—` where none was measured), and the command
    that runs it."""
    from fedbench_sweeps.recipe import RecipeError, load
    from fedbench_sweeps.shipped import describe, find, names

    lines = ["| recipe | reproduces | runs | time on 2 cores | time on one GPU | command |", "|---" * 6 + "|"]
    chosen = [name for name in names() if name.startswith(prefix)]
    if not chosen:
        raise ValueError(f"no shipped recipe starts with {prefix!r}")  # a gallery page naming a removed recipe
    for name in chosen:
        about = describe(find(name))
        try:
            recipe = load(find(name))
            runs = f"{len(recipe.trials()) // len(recipe.seeds)} × {len(recipe.seeds)}"
        except RecipeError:
            runs = "?"
        data = " --data-dir ../shared/data" if "real data" in about.get("reproduces", "") else ""
        lines.append(f"| `{name}` | {cell(about.get('reproduces', '—'))} | {runs} | "
                     f"{cell(about.get('time on 2 cores', '—'))} | {cell(about.get('time on one GPU', '—'))} | "
                     f"`fedbench sweep {name}{data}` |")
    return "\n".join(lines)


# -- the gallery's deviations ------------------------------------------------------------------------------------

DEVIATIONS_MARKER = re.compile(r"<!-- deviations: (\S+) -->")


def number(value: float) -> str:
    return str(value).replace("-", "−")  # as declared: 0.80 is 0.8, 1.0 stays 1.0


def deviations_list(paper: str) -> str:
    """The paper's claims that fedbench does not reproduce, each as declared in `sweeps/deviations.py`: the figure,
    the claim and what the paper reports, what fedbench measures instead, why, and the test that measures it."""
    from fedbench_sweeps.deviations import of_paper

    declared = of_paper(paper)
    if not declared:
        raise ValueError(f"no deviation declared for {paper!r}")  # a gallery page naming a paper with none
    lines = ["Declared in `sweeps/deviations.py` with the values measured here; each is checked by the paper-size "
             "test it names (`pytest -m slow`), which fails if a value moves, e.g. when the paper's claim comes "
             "to reproduce.", ""]
    for deviation in declared.values():
        unit = f" {deviation.unit}" if deviation.unit else ""
        measured = ", ".join(f"{name} {number(value)}" for name, value in deviation.measured.items())
        lines.append(f"- {deviation.figure}: \"{deviation.claim}\" (the paper: {deviation.reports}). Measured here: "
                     f"{measured}{unit}. {deviation.why[0].upper()}{deviation.why[1:]}. Test: `{deviation.test}`.")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    markdown = RECIPES_MARKER.sub(lambda match: recipes_table(match.group(1)), markdown)
    return DEVIATIONS_MARKER.sub(lambda match: deviations_list(match.group(1)), markdown)
