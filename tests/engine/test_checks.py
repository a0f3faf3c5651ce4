"""`fedbench.engine.checks`: the build-time rules listed once. A run's record (the engine) and a recipe's validator refuse
the same faults with the same message at the same field path (`Refusal.path`), for rules of each kind: the federation
against the algorithm's uploads, its participation, the server optimizer, a registered axis's own rule
(`fedbench.axes.registry`), the federation's fields against the problem's clients, and a minibatch size an algorithm's
hyperparameter sets (at the algorithm's field); and uneven local work, which an algorithm takes where its dry round
(`fedbench.engine.dry_round`) reads nothing such a round does not define, every registered algorithm and the tutorial's
classified as each declared before the inference replaced the declarations."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import fedbench
from fedbench.algorithms import ALGORITHMS
from fedbench.axes.client_dropout import ClientDropout
from fedbench.engine.checks import Refusal, check_run
from fedbench.engine.dry_round import takes_uneven_steps
from fedbench.engine.simulate import Federation, Simulation
from fedbench.hparams import resolve
from fedbench.problems import PROBLEMS
from helpers import invoke, refused
from small_problems import small_lasso

PROBLEM = "{name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}"
FAULTS = {  # id: (algorithm, its hyperparameters, the federation as a recipe writes it, as the engine takes it)
    "krum with f too large": ("fedavg", {}, "{clients_per_round: 3, aggregation: krum, byzantine: 1}",
                              dict(clients_per_round=3, aggregation="krum", byzantine=1)),
    "a varying participation with a robust rule": (
        "fedavg", {}, "{aggregation: median, participation: {model: bernoulli, p: 0.5}}",
        dict(aggregation="median", participation={"model": "bernoulli", "p": 0.5})),
    "more clients a round than the problem has": ("fedavg", {}, "{clients_per_round: 9}", dict(clients_per_round=9)),
    "a batch above the smallest client": ("fedavg", {}, "{batch_size: 21}", dict(batch_size=21)),
    "dropout with a robust rule": ("fedavg", {}, "{aggregation: median, client_dropout: 0.2}",
                                   dict(aggregation="median", axes=(ClientDropout(0.2),))),
    "uneven work where the round's length is read": (
        "fedda", {}, "{local_steps: {distribution: uniform, low: 1, high: 3}}",
        dict(local_steps={"distribution": "uniform", "low": 1, "high": 3})),
    "uneven work with FedMiD's yuan threshold": (
        "fedmid", {"server_threshold": "yuan"}, "{local_steps: {counts: [1, 2, 1, 2, 1, 2, 1, 2]}}",
        dict(local_steps={"counts": [1, 2, 1, 2, 1, 2, 1, 2]})),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_the_engine_and_the_validator_refuse_a_fault_alike_at_its_path(fault, tmp_path):
    algorithm, hp, written, given = FAULTS[fault]
    problem = small_lasso()
    with pytest.raises(Refusal) as engine:
        Simulation(problem, fedbench.make_algorithm(algorithm, problem, **hp), Federation(rounds=2, **given), 0)
    recipe = tmp_path / "r.yaml"
    hp_written = ", ".join(f"{name}: {value}" for name, value in hp.items())
    recipe.write_text(f"problem: {PROBLEM}\nfederation: {written}\nalgorithms: {{{algorithm}: {{{hp_written}}}}}\n")
    line = refused(invoke("validate", recipe))
    assert line == f"error: {recipe}: {engine.value.path}: {engine.value.message}"


def test_a_minibatch_size_set_by_a_hyperparameter_is_refused_at_the_algorithms_field():
    lasso, per_fedavg = PROBLEMS["lasso"], fedbench.ALGORITHMS["per_fedavg"]
    config = lasso.resolve_config(dict(clients=8, samples_per_client=20, dim=30, support=10))
    hp = resolve(per_fedavg.hparams, {"inner_batch": 21}, per_fedavg.name, per_round=True)
    with pytest.raises(Refusal) as refusal:
        check_run(lasso, config, per_fedavg, hp, Federation(rounds=2, clients_per_round=4))
    assert refusal.value.path == "algorithms.per_fedavg.inner_batch"
    assert refusal.value.message == "found 21, expected at most problem.samples_per_client = 20"


# -- uneven local work, inferred --------------------------------------------------------------------------------------

# What each algorithm declared (`takes_uneven_steps`, 9 overrides of a default False) before a dry round inferred it,
# with its default hyperparameters, and the values of a choice that changed it: why each is what it is.
DECLARED = {
    "fedavg": True,  # its steps read no round length: a client past its count keeps its u
    "fedmid": True,  # as FedAvg's, with a prox; but yuan's threshold η_s·η_c·E reads the round's E (below)
    "fedda": False,  # its prox's elapsed step sums read rnd.local_steps
    "ditto": True,  # its steps read no round length: a client past its count keeps its u and v
    "fast_fedda": False,  # its weights read the global iteration rE + j and its last step (rnd.iteration)
    "c_fedda": False,  # its constrained prox reads rnd.local_steps
    "mc_fedda": False,  # FedDA's prox (rnd.local_steps)
    "fedxl1": False,  # its step size decays with the local iterations before the round (rnd.iteration)
    "fedxl2": False,  # as FeDXL1
    "local_pair": False,  # as FeDXL1
    "local_sgd_ce": False,  # its step size decays with the iterations before the round (rnd.iteration)
    "centralized": False,  # Local Pair on one client
    "codasca": False,  # its control variate divides by rnd.local_steps; its stages read rnd.iteration
    "pfedfbe": True,  # its steps read no round length: a client past its count keeps its w
    "pfedme": True,  # its steps read no round length: a client past its count keeps its w_loc and θ
    "fedprox": True,  # the variable local work FedProx allows (Li et al. 2020): its steps read no round length
    "lsgd_pfl": False,  # never declared (the default): see INFERRED_OTHERWISE
    "acd_pfl": False,  # the w-update at the round's last step (rnd.is_last_step), rounds of a drawn length
    "ascd_pfl": False,  # as ACD-PFL
    "asvrcd_pfl": False,  # as ACD-PFL
    "scd_pfl": False,  # as ACD-PFL
    "svrcd_pfl": False,  # as ACD-PFL
    "l2sgd_plus": False,  # the averaging step at the round's last step (rnd.is_last_step), rounds of a drawn length
    "per_fedavg": True,  # its steps read no round length: a client past its count keeps its w
    "scaffold": True,  # option II divides by each client's own K (rnd.client_steps)
    "my_method": False,  # the tutorial's FedAvgM: never declared (the default): see INFERRED_OTHERWISE
}
DECLARED_WITH = {("fedmid", "server_threshold", "yuan"): False}  # every other choice as the defaults
# Where the default False was no declaration at all, the dry round finds what the maths reads: LSGD-PFL's local SGD
# on (w_m, β_m) and the tutorial's FedAvgM read neither the round's length, its last step nor the iterations before
# it, so each client may take its own count (a client past it keeps its rows), as FedAvg's.
INFERRED_OTHERWISE = {"lsgd_pfl", "my_method"}


def tutorials_method():
    """The class `my_method.py` of the tutorial "Compare your own method" defines, as the page writes it."""
    page = (Path(__file__).parents[2] / "docs/tutorials/compare-your-own-method.md").read_text()
    source = re.search(r'```python title="my_method.py"\n(.*?)```', page, re.S).group(1)
    scope: dict = {}
    exec(compile(source, "my_method.py", "exec"), scope)
    return scope["MyMethod"]


def choices(cls):
    """(name, value) of every choice and flag of `cls` other than its default."""
    for p in cls.hparams:
        for value in p.choices if p.kind == "choice" else (True, False) if p.kind == "bool" else ():
            if value != p.default:
                yield p.name, value


def test_every_algorithm_takes_uneven_work_as_it_declared_before_the_dry_round_inferred_it():
    classes = {**ALGORITHMS, "my_method": tutorials_method()}
    assert set(DECLARED) == set(classes)
    for name, cls in classes.items():
        defaults = resolve(cls.hparams, {}, cls.name)
        expected = DECLARED[name] != (name in INFERRED_OTHERWISE)
        assert takes_uneven_steps(cls, defaults) is expected, name
        for param, value in choices(cls):
            declared = DECLARED_WITH.get((name, param, value), DECLARED[name]) != (name in INFERRED_OTHERWISE)
            assert takes_uneven_steps(cls, {**defaults, param: value}) is declared, (name, param, value)


def test_the_dry_round_draws_on_no_stream_of_a_run_nor_the_global_one():
    problem, federation = small_lasso(), Federation(rounds=2, clients_per_round=3,
                                                    local_steps={"distribution": "uniform", "low": 1, "high": 3})
    alone = Simulation(problem, fedbench.make_algorithm("scaffold", problem), federation, 1)
    streams = {name: gen.get_state() for name, gen in alone.streams().items()}
    global_rng = torch.get_rng_state()
    assert takes_uneven_steps(ALGORITHMS["pfedme"], resolve(ALGORITHMS["pfedme"].hparams, {}, "pfedme"))
    assert all(torch.equal(streams[name], gen.get_state()) for name, gen in alone.streams().items())
    assert torch.equal(global_rng, torch.get_rng_state())


def test_lsgd_pfl_and_the_tutorials_method_now_take_uneven_work(tmp_path):
    """Refused before (their default False), taken now: the validator accepts them and a round runs."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("problem: {name: pfl_synthetic, preset: s1}\n"
                      "federation: {rounds: 1, local_steps: {distribution: uniform, low: 1, high: 3}, batch_size: 2}\n"
                      "algorithms: {lsgd_pfl: {}}\n")
    assert invoke("validate", recipe).exit_code == 0
    problem = small_lasso()
    method = tutorials_method()
    sim = Simulation(problem, method(problem), Federation(rounds=1, clients_per_round=3,
                                                         local_steps={"counts": [1, 2, 3, 1, 2, 3, 1, 2]}), 0)
    sim.run_round()
    assert sim.iterations == 3
