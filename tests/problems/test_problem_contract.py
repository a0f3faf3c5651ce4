"""The problem interface as a contract (issue 61): `Problem` is what is read before building (`ProblemSpec`: the
class's declarations and classmethods of a config), its clients' rows and their draws, its full-data oracles and the
instance's own hooks; the seven names of `CONTRACT` are what a problem writes, every shipped problem and the
how-to's write them, and a plugin that lacks one is refused at validate."""
from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from fedbench.plugins import REQUIRED
from fedbench.problems import PROBLEMS
from fedbench.problems.base import CONTRACT, Problem
from fedbench.problems.full_data import FullDataOracles
from fedbench.problems.sampling import ClientRows
from fedbench.problems.spec import ProblemSpec
from helpers import invoke

ROOT = Path(__file__).resolve().parents[2]
PARTS = (Problem, ProblemSpec, ClientRows, FullDataOracles)
# What fedbench/ and sweeps/ read of a problem's class before building one (the callers of `PROBLEMS[name]`).
READ_BEFORE_BUILDING = ("name", "params", "presets", "resolve_config", "check", "declared_layout", "capabilities",
                        "declared_metrics", "code_hashes", "carried_code", "shared_by_seeds", "run_bytes",
                        "state_bytes", "size_params", "compute_bound_steps")


def how_to_source() -> str:
    page = (ROOT / "docs" / "how-to" / "write-a-problem.md").read_text()
    return re.search(r'^```python title="my_problem.py"\n(.*?)^```', page, re.S | re.M).group(1)


def load(path: Path, class_name: str) -> type:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, class_name)


def written_by(cls: type, name: str) -> type:
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def test_what_is_read_before_building_is_the_spec_of_classmethods():
    assert set(READ_BEFORE_BUILDING) <= {*vars(ProblemSpec), *ProblemSpec.__annotations__}
    hooks = [name for name, value in vars(ProblemSpec).items() if callable(getattr(value, "__func__", value))
             and not name.startswith("__")]
    assert hooks and all(isinstance(vars(ProblemSpec)[name], classmethod) for name in hooks)
    for cls in PROBLEMS.values():  # no shipped problem turns a spec hook into one that needs an instance
        assert [name for name in hooks if not isinstance(inspect.getattr_static(cls, name), classmethod)] == [], cls


def test_every_shipped_problem_and_the_how_tos_writes_the_contract(tmp_path):
    assert set(CONTRACT) == {"name", "params", *REQUIRED["problem"]} and len(CONTRACT) == 7
    (tmp_path / "my_problem.py").write_text(how_to_source())
    plugins = (load(tmp_path / "my_problem.py", "DriftingLeastSquares"),
               load(ROOT / "examples" / "fedbench-fedopt" / "fedbench_fedopt" / "quadratic.py", "Quadratic"))
    for cls in (*PROBLEMS.values(), *plugins):
        # rows of per-client blocks (pfl_*, `evaluates_global_model = False`) are made by `evaluate` itself
        evaluated = not cls.evaluates_global_model and written_by(cls, "evaluate") not in PARTS
        assert [name for name in CONTRACT if written_by(cls, name) in PARTS
                and not (name == "evaluate_global" and evaluated)] == [], cls.__name__


@pytest.mark.parametrize("hook", REQUIRED["problem"])
def test_a_problem_plugin_without_a_hook_of_the_contract_is_refused_in_one_line(tmp_path, hook):
    """`metrics`, a classmethod, was let through: the check compared two bound methods, a new one at every read."""
    source = how_to_source()
    assert f"def {hook}(" in source
    (tmp_path / "my_problem.py").write_text(source.replace(f"def {hook}(", f"def {hook}_elsewhere("))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("plugins: [my_problem.py]\nproblem: {name: drifting_lsq}\n"
                      "federation: {rounds: 2, clients_per_round: 4, local_steps: 2, batch_size: 5}\n"
                      "algorithms: {fedavg: {}}\n")
    result = invoke("validate", recipe)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"plugins[0]: plugin my_problem.py: problem drifting_lsq does not define {hook}" in result.output
