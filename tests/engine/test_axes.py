"""The registry of the run's axes (`fedbench.axes.registry.AXES`): every field the recipe's parser takes under `federation:`
beside the federation's own parameters, and the top-level `privacy:` and `compile:`, is an entry, which the parser,
`fedbench list` and the reference's recipe page read; each axis's build-time rules are its own `check`, which
`fedbench.engine.checks.check_federation` iterates, refusing with the messages the rules had where they were written apart
(in `Federation.check` and `check_federation`), at the same paths."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

import fedbench
from fedbench.axes.registry import AXES, Mapped, Section, in_federation, sections
from fedbench.engine.checks import Refusal
from fedbench.engine.simulate import Federation, Simulation
from fedbench.hparams import Param, ParamError
from helpers import invoke, refused
from small_problems import small_lasso
from sweeps.recipe import RecipeModel, parse
from sweeps.recipe.trials import FEDERATION_PARAMS

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = {"name": "lasso", "clients": 8, "samples_per_client": 20, "dim": 30, "support": 10}


def recipe(federation: dict, **top) -> dict:
    return {"problem": PROBLEM, "federation": {"rounds": 2, "clients_per_round": 3, **federation},
            "algorithms": {"fedavg": {}}, **top}


def test_every_field_the_parser_takes_under_federation_or_at_the_top_level_as_an_axis_is_registered():
    """`Federation`'s fields that are not its own parameters are axes (the chains among them), `privacy:` and
    `compile:` too; each axis's example, as a recipe writes it, parses into the federation's grid."""
    own = {p.name for p in FEDERATION_PARAMS}
    fields = {f.name for f in dataclasses.fields(Federation)} - own - {"axes"}
    assert fields == {axis.key for axis in in_federation() if not axis.held and not axis.plain}
    assert {axis.key for axis in in_federation() if axis.plain} == {"local_steps"} <= own  # E, or a mapping
    assert {axis.key for axis in in_federation() if axis.held} == {"client_dropout"}
    assert {"uplink", "downlink"} <= set(AXES) and {axis.key for axis in sections()} == {"privacy", "compile"}
    assert all(axis.key in RecipeModel.model_fields and axis.path == axis.key for axis in sections())
    for axis in in_federation():
        assert axis.path == f"federation.{axis.key}"
        parsed = parse(recipe({axis.key: yaml.safe_load(axis.example)}), "r.yaml")
        assert axis.key in parsed.federation_grid, axis.key


def test_the_top_level_axes_reach_the_recipe_through_the_registry():
    parsed = parse(recipe({"uplink": [{"clip": 1.0}, {"gaussian": 1.0}]}, privacy={"delta": 1e-5, "accountant": "rdp"},
                          compile="off"), "r.yaml")
    assert set(parsed.sections) == {"privacy", "compile"}
    assert (parsed.delta, parsed.accountant, parsed.compile) == (1e-5, "rdp", "off")
    trial = parsed.trials()[0]
    assert (trial.delta, trial.accountant, trial.compile) == (1e-5, "rdp", "off")


def reference_hook():
    spec = importlib.util.spec_from_file_location("reference_hook_axes", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_fedbench_list_and_the_reference_show_every_axis():
    overview = invoke("list")
    assert overview.exit_code == 0, overview.output
    page = reference_hook().recipe_page()
    for axis in AXES.values():
        listed = invoke("list", axis.path)
        assert listed.exit_code == 0, (axis.path, listed.output)
        assert any(line.startswith(f"{axis.path}") for line in listed.output.splitlines()), listed.output
        assert axis.path in overview.output, axis.path
        assert f"| `{axis.path}` |" in page, axis.path  # the Axes table
        for param in axis.params:
            assert f"{param.name}: {param.kind}" in listed.output, (axis.path, param.name)


FAULTS = {  # the federation as the engine takes it, the refusal's path and message as they were before the registry
    "participation: a varying number with a robust rule": (
        "fedavg", dict(aggregation="median", participation={"model": "bernoulli", "p": 0.5}),
        "participation", "participation.model",
        "found bernoulli with aggregation median (a rule of S uploads); expected uniform or cyclic"),
    "participation: a model not uniform with DP-FedAvg's noise": (
        "fedavg", dict(uplink=[{"clip": 1.0}, {"gaussian": 1.0}],
                       participation={"model": "markov", "p_on": 0.5, "p_off": 0.5}),
        "participation", "participation.model",
        "found markov with DP-FedAvg's noise (accounted for S of N drawn uniformly); expected uniform"),
    "participation: more groups than clients": (
        "fedavg", dict(participation={"model": "cyclic", "groups": 9}), "participation", "participation.groups",
        "found 9, expected at most the problem's 8 clients"),
    "local_steps: epochs where minibatches cannot be short": (
        "fedavg", dict(local_steps={"epochs": 1}), "local_steps", "local_steps.epochs",
        "found 1 for a problem whose minibatches cannot be short; expected counts, file or distribution"),
    # uneven work for an algorithm that does not take it is refused above the axes, by its dry round
    # (`fedbench.engine.checks.check_uneven_work`, tests/engine/test_checks.py's FAULTS)
    "adversaries: a fraction out of range": (
        "fedavg", dict(adversaries={"fraction": 1.5}), "adversaries", "adversaries.fraction",
        "expected float in [0, 1), found 1.5"),
    "server_optimizer: a field its rule does not read": (
        "fedavg", dict(server_optimizer={"name": "sgd", "beta1": 0.9}), "server_optimizer",
        "server_optimizer.beta1", "found 0.9 with sgd, which reads lr"),
    "uplink: noise without a clip": (
        "fedavg", dict(uplink=[{"gaussian": 1.0}]), "uplink", "uplink.0.gaussian",
        "found no clip before gaussian, expected one: the noise σC/S is on its C"),
    "downlink: two compressors": (
        "fedavg", dict(downlink=[{"top_k": 0.1}, {"qsgd": 4}]), "downlink", "downlink.1.qsgd",
        "found qsgd as step 1 of the downlink, expected one top_k or qsgd"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_axis_refuses_by_its_own_check_with_the_message_it_had(fault):
    """The rule moved from `Federation.check` / `check_federation` into the axis's `check` refuses alike: called on
    the axis, and through a run's record (`check_federation`), at `federation.` + the path."""
    name, given, key, path, message = FAULTS[fault]
    problem = small_lasso()
    algorithm = fedbench.make_algorithm(name, problem)
    federation = Federation(rounds=2, clients_per_round=3, **given)
    axis = AXES[key]
    assert not isinstance(axis, Section)
    with pytest.raises(ParamError) as own:
        axis.check(federation, algorithm, algorithm.declared, problem.layout())
    assert (own.value.name, own.value.message) == (path, message)
    with pytest.raises(Refusal) as run:
        Simulation(problem, algorithm, federation, 0)
    assert (run.value.path, run.value.message) == (f"federation.{path}", message)
    for other in in_federation():  # no other axis refuses it
        if other is not axis:
            other.check(federation, algorithm, algorithm.declared, problem.layout())


def test_the_privacy_axis_refuses_noise_without_its_section_at_the_steps_field(tmp_path):
    federation = Federation(rounds=2, clients_per_round=3, uplink=[{"clip": 1.0}, {"gaussian": 1.0}])
    with pytest.raises(ParamError) as err:
        AXES["privacy"].check(None, federation)
    assert err.value.name == "federation.uplink.1.gaussian"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe({"uplink": [{"clip": 1.0}, {"gaussian": 1.0}]})))
    line = refused(invoke("validate", path))
    assert line == f"error: {path}: federation.uplink.1.gaussian: {err.value.message}"
    assert err.value.message == ("found noise without a privacy section, expected `privacy: {delta: 1.0e-5}` at the "
                                 "top level (ε at that δ in every row)")


class Probe:
    """A made-up axis: a mapping of one rate."""
    params = (Param("rate", "float", 0.5, "a rate", low=0, high=1),)

    def __init__(self, rate: float = 0.5):
        self.rate = rate


def refuse_high_rates(federation, algorithm, hp, layout) -> None:
    raise ParamError("probe.rate", f"found a probe for {algorithm.name}, expected none")


def test_check_federation_applies_the_rule_of_an_axis_the_registry_gains(monkeypatch, tmp_path):
    """A new axis's rule is applied by the engine and the validator alike, with no other file touched."""
    monkeypatch.setitem(AXES, "probe", Mapped("probe", Probe, "{rate: 0.5}", rule=refuse_high_rates))
    problem = small_lasso()
    with pytest.raises(Refusal) as run:
        Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(rounds=2, clients_per_round=3), 0)
    assert (run.value.path, run.value.message) == ("federation.probe.rate", "found a probe for fedavg, expected none")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe({})))
    assert refused(invoke("validate", path)) == f"error: {path}: federation.probe.rate: found a probe for fedavg, " \
                                                "expected none"


def test_the_tuning_space_searches_any_mapping_axis_of_the_registry():
    """`federation.KEY.NAME` for every mapping axis (client dropout's p among them, which the space named apart
    refused); a field the recipe's mapping does not read refused as before."""
    tune = {"metric": "objective", "mode": "min", "trials": 2}
    dropout = parse(recipe({}, tune={**tune, "space": {"federation.client_dropout.p": {"uniform": [0.0, 0.5]}}}),
                    "r.yaml")
    assert [(d.key, d.bounds) for d in dropout.dimensions] == [("federation.client_dropout.p", (0.0, 0.5))]
    with pytest.raises(Exception, match="reading groups, expected one that reads p"):
        parse(recipe({"participation": {"model": "cyclic", "groups": 2}},
                     tune={**tune, "space": {"federation.participation.p": {"uniform": [0.1, 0.5]}}}), "r.yaml")
