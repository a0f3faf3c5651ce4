"""YAML recipes: read (safe_load only), override (`--set path=value`), validate against the engine's
own declarations of problems and hyperparameters, and turn into trials.

Every error is a `RecipeError` naming the file, the field path, what was found and what was expected,
and the closest valid name for a misspelt problem, algorithm or parameter.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedbench.algorithms import ALGORITHMS
from fedbench.hparams import Param, resolve
from fedbench.problems import PROBLEMS
from fedbench.simulate import Federation

FEDERATION_FIELDS = {
    "rounds": Param("rounds", "int", None, "communication rounds R", low=0),
    "clients_per_round": Param("clients_per_round", "int", None, "clients sampled per round S", low=1),
    "local_steps": Param("local_steps", "int", None, "local steps E per round", low=1),
    "batch_size": Param("batch_size", "int", None, "minibatch size b", low=1),
    "aggregation": Param("aggregation", "choice", "uniform", "server weights over the sampled clients",
                         choices=("uniform", "samples")),
}
TOP_LEVEL = ("name", "problem", "federation", "algorithms", "seeds", "eval_every", "device")


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader (no tags that build Python objects) that also reads `1e-3` as a float, as YAML 1.2
    does; YAML 1.1 wants `1.0e-3` and would hand the researcher a string."""


RecipeLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_value(text: str) -> Any:
    return yaml.load(text, Loader=RecipeLoader)


class RecipeError(ValueError):
    def __init__(self, source: str, path: str, message: str):
        self.source, self.path = source, path
        super().__init__(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def closest(name: str, options) -> str:
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


@dataclass(frozen=True)
class Trial:
    """One fully specified run: a problem instance, one algorithm with one value per hyperparameter, a seed."""
    recipe: str
    problem: str
    problem_config: dict[str, Any]
    algorithm: str
    hyperparameters: dict[str, Any]
    federation: Federation
    seed: int
    eval_every: int
    device: str


def read_yaml(path: str | Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise RecipeError(source, "", f"cannot read the file ({err.strerror})") from None
    try:
        raw = yaml_value(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "python/" in problem:
            problem = "a !!python tag is refused (recipes are read with safe_load and never build objects)"
        raise RecipeError(source, "", f"malformed YAML: {where}{problem}") from None
    if not isinstance(raw, dict):
        raise RecipeError(source, "", f"expected a mapping at the top level, found {type(raw).__name__}")
    return raw


def apply_overrides(raw: dict[str, Any], assignments: list[str], source: str, algorithm: str | None = None) -> dict:
    """`path=value` assignments (value parsed as YAML); `algorithm.x` means the selected algorithm's x."""
    for assignment in assignments:
        path, sep, text = assignment.partition("=")
        if not sep or not path:
            raise RecipeError(source, "--set", f"expected path=value, found {assignment!r}")
        keys = path.split(".")
        if keys[0] == "algorithm":
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


def _mapping(source, path, value) -> dict:
    if not isinstance(value, dict):
        raise RecipeError(source, path, f"expected a mapping, found {value!r}")
    return value


def _check_values(source: str, path: str, param: Param, value: Any) -> list[Any]:
    """A list is a grid axis, a scalar one value; each value checked. For a list-valued parameter
    (kind `floats`, e.g. a per-stage schedule) one list is one value and a list of lists a grid axis."""
    if param.kind == "floats":
        is_grid = isinstance(value, list) and bool(value) and all(isinstance(v, list) for v in value)
    else:
        is_grid = isinstance(value, list)
    values = value if is_grid else [value]
    if not values:
        raise RecipeError(source, path, "found an empty list, expected at least one value")
    checked = []
    for i, v in enumerate(values):
        try:
            checked.append(param.check(v))
        except ValueError as err:
            raise RecipeError(source, f"{path}[{i}]" if is_grid else path, str(err)) from None
    return checked


def _check_params(source, path, declared, given: dict) -> dict[str, list[Any]]:
    by_name = {p.name: p for p in declared}
    grid = {}
    for key, value in given.items():
        if key not in by_name:
            raise RecipeError(source, f"{path}.{key}", f"unknown parameter{closest(key, by_name)}; "
                              f"expected one of {', '.join(by_name)}")
        grid[key] = _check_values(source, f"{path}.{key}", by_name[key], value)
    return grid


@dataclass
class Recipe:
    source: str
    name: str
    problem: str
    problem_grid: dict[str, list[Any]]
    federation_grid: dict[str, list[Any]]
    algorithms: dict[str, dict[str, list[Any]]]
    seeds: list[int]
    eval_every: int
    device: str

    def single_trial(self, algorithm: str | None = None, seed: int | None = None) -> Trial:
        """The one trial `fedbench run` runs: every parameter must have exactly one value."""
        if algorithm is None:
            if len(self.algorithms) != 1:
                raise RecipeError(self.source, "algorithms",
                                  f"the recipe compares {', '.join(self.algorithms)}; choose one with --algorithm")
            algorithm = next(iter(self.algorithms))
        if algorithm not in self.algorithms:
            raise RecipeError(self.source, "--algorithm", f"found {algorithm!r}, expected one of "
                              f"{', '.join(self.algorithms)}{closest(algorithm, self.algorithms)}")
        sections = {"problem": self.problem_grid, "federation": self.federation_grid,
                    f"algorithms.{algorithm}": self.algorithms[algorithm]}
        chosen = {}
        for section, grid in sections.items():
            for key, values in grid.items():
                if len(values) != 1:
                    raise RecipeError(self.source, f"{section}.{key}", f"found {len(values)} values {values}, "
                                      f"expected one for a single run; pick one with --set {section}.{key}=VALUE")
            chosen[section] = {k: v[0] for k, v in grid.items()}
        return self._trial(chosen["problem"], chosen["federation"], algorithm,
                           chosen[f"algorithms.{algorithm}"], self.seeds[0] if seed is None else seed)

    def _trial(self, problem_values, federation_values, algorithm, hyperparameters, seed) -> Trial:
        federation = Federation(**federation_values)
        problem_config = PROBLEMS[self.problem].resolve_config(problem_values)
        clients = problem_config["clients"]
        if federation.clients_per_round > clients:
            raise RecipeError(self.source, "federation.clients_per_round",
                              f"found {federation.clients_per_round}, expected at most problem.clients = {clients}")
        samples = problem_config.get("samples_per_client")
        if samples is not None and federation.batch_size > samples:
            raise RecipeError(self.source, "federation.batch_size",
                              f"found {federation.batch_size}, expected at most problem.samples_per_client = {samples}")
        cls = ALGORITHMS[algorithm]
        return Trial(self.name, self.problem, problem_config, algorithm,
                     resolve(cls.hparams, hyperparameters, algorithm), federation, seed, self.eval_every, self.device)


def parse(raw: dict[str, Any], source: str) -> Recipe:
    for key in raw:
        if key not in TOP_LEVEL:
            raise RecipeError(source, str(key), f"unknown field{closest(key, TOP_LEVEL)}; expected one of {', '.join(TOP_LEVEL)}")
    for key in ("name", "problem", "federation", "algorithms"):
        if key not in raw:
            raise RecipeError(source, key, "missing required field")
    name = raw["name"]
    if not isinstance(name, str) or not name.strip():
        raise RecipeError(source, "name", f"expected a non-empty string, found {name!r}")

    problem = dict(_mapping(source, "problem", raw["problem"]))
    problem_name = problem.pop("name", None)
    if problem_name not in PROBLEMS:
        raise RecipeError(source, "problem.name", f"found {problem_name!r}, expected one of "
                          f"{', '.join(PROBLEMS)}{closest(problem_name, PROBLEMS)}")
    problem_grid = _check_params(source, "problem", PROBLEMS[problem_name].params, problem)

    federation = _mapping(source, "federation", raw["federation"])
    for key in FEDERATION_FIELDS:
        if key not in federation and FEDERATION_FIELDS[key].default is None:
            raise RecipeError(source, f"federation.{key}", "missing required field")
    federation_grid = _check_params(source, "federation", FEDERATION_FIELDS.values(), federation)

    algorithms_raw = _mapping(source, "algorithms", raw["algorithms"])
    if not algorithms_raw:
        raise RecipeError(source, "algorithms", "found no algorithm, expected at least one")
    algorithms = {}
    for algo, hps in algorithms_raw.items():
        if algo not in ALGORITHMS:
            raise RecipeError(source, f"algorithms.{algo}", f"unknown algorithm{closest(algo, ALGORITHMS)}; "
                              f"expected one of {', '.join(ALGORITHMS)}")
        hps = {} if hps is None else _mapping(source, f"algorithms.{algo}", hps)
        algorithms[algo] = _check_params(source, f"algorithms.{algo}", ALGORITHMS[algo].hparams, hps)

    seeds = raw.get("seeds", 1)
    if isinstance(seeds, bool) or not (isinstance(seeds, int) and seeds >= 1 or
                                       isinstance(seeds, list) and seeds and
                                       all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise RecipeError(source, "seeds", f"found {seeds!r}, expected a count >= 1 or a non-empty list of integers >= 0")
    seeds = list(range(seeds)) if isinstance(seeds, int) else seeds
    if len(set(seeds)) != len(seeds):
        raise RecipeError(source, "seeds", f"found repeated seeds {seeds}")

    eval_every = raw.get("eval_every", 10)
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
        raise RecipeError(source, "eval_every", f"found {eval_every!r}, expected an integer >= 1")
    device = raw.get("device", "cpu")
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
        raise RecipeError(source, "device", f"found {device!r}, expected cpu or cuda[:N]")
    return Recipe(source, name, problem_name, problem_grid, federation_grid, algorithms, seeds, eval_every, device)


def load(path: str | Path, overrides: list[str] | None = None, algorithm: str | None = None) -> Recipe:
    source = str(path)
    raw = apply_overrides(read_yaml(path), overrides or [], source, algorithm)
    return parse(raw, source)
